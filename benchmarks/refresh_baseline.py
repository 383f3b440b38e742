"""Refresh the committed baseline sweep (benchmarks/baseline-sweep/).

    python benchmarks/refresh_baseline.py

Runs the small predict-only CI sweep (configs/sweeps/ci-small.yaml) through
the real CLI into benchmarks/baseline-sweep/ (no plots, so the folder is only
text). tests/test_sweep_baseline.py runs the same sweep and fails when any
prediction moves beyond its threshold either way, or a setting changes status.

A change to the memory or step-time model, a catalog or a heuristic that
moves predictions MUST refresh the baseline in the same commit (and say in
the commit message by how much predictions moved: `autoconfig compare` prints
it), so the baseline always matches the model of its commit.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "configs" / "sweeps" / "ci-small.yaml"
BASELINE = ROOT / "benchmarks" / "baseline-sweep"


def main() -> int:
    previous = None
    if BASELINE.exists():
        previous = BASELINE.with_name(BASELINE.name + ".old")
        shutil.rmtree(previous, ignore_errors=True)
        BASELINE.rename(previous)
    code = subprocess.run([sys.executable, "-m", "autoconfig", "sweep", str(SWEEP.relative_to(ROOT)),
                           "-o", str(BASELINE.relative_to(ROOT)), "--no-plots"],
                          cwd=ROOT).returncode
    if code != 0:
        print(f"sweep failed (exit {code})", file=sys.stderr)
        return code
    if previous is not None:
        subprocess.run([sys.executable, "-m", "autoconfig", "compare", str(previous), str(BASELINE),
                        "--threshold", "0"], cwd=ROOT)
        shutil.rmtree(previous)
    print(f"baseline refreshed: {BASELINE.relative_to(ROOT)} (commit it with the change)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
