"""The project's own CI check: run the small predict-only sweep through the CLI and
compare it with the committed baseline (benchmarks/baseline-sweep/).

Fails when any prediction moves by more than THRESHOLD_PCT either way, or a
setting changes status or is missing. A model change that moves predictions
must refresh the baseline in the same commit: python benchmarks/refresh_baseline.py
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SWEEP = ROOT / "configs" / "sweeps" / "ci-small.yaml"
BASELINE = ROOT / "benchmarks" / "baseline-sweep"
THRESHOLD_PCT = 0.5
"""Predictions are deterministic: anything beyond rounding is a model change."""


def test_predictions_match_the_committed_baseline(tmp_path):
    out = tmp_path / "tonight"
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "sweep", str(SWEEP), "-o",
                           str(out), "--no-plots"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "compare", str(BASELINE),
                           str(out), "--threshold", str(THRESHOLD_PCT), "--either-way"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (
        "predictions moved from the committed baseline; if the model change is intended, run "
        "`python benchmarks/refresh_baseline.py` and commit the result with it:\n" + proc.stdout)
    assert "only in" not in proc.stdout
