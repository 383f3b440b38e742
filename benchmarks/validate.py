"""Validate the analytical step-time (and memory) model on the shipped published runs.

Same as ``autoconfig validate``: prints per-row errors, MAPE per source and
overall, the Spearman rank correlation within groups measured in one setting,
and memory errors where measured. Targets are printed, not asserted.

    python benchmarks/validate.py [--summary]
"""

import sys

from autoconfig.cli import main

if __name__ == "__main__":
    main(["validate", *sys.argv[1:]])
