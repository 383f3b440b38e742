"""`validate --runs FILE`: a bad row of a user's file is set aside with its
reason; the rest are scored."""

import csv
from pathlib import Path

import pytest

from cli_runner import run_cli

SHIPPED = Path(__file__).resolve().parents[1] / "benchmarks" / "published_runs.csv"


def _subset(tmp_path: Path, change) -> Path:
    with SHIPPED.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    rows = [dict(r) for r in rows[:12]]
    change(rows)
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("column, value, reason", [
    ("num_gpus", "-32", "num_gpus '-32' must be a whole number from 1"),
    ("num_gpus", "0", "num_gpus '0' must be a whole number from 1"),
    ("tp", "7", "must be a whole number of nodes"),
    ("gpu_type", "", "gpu_type not stated"),
    ("num_layers", "abc", "num_layers 'abc': not a number"),
    ("tp", "eight", "tp 'eight': not a number"),
])
def test_a_bad_row_is_listed_not_fatal(tmp_path: Path, capsys, column, value, reason) -> None:
    runs = _subset(tmp_path, lambda rows: rows[0].__setitem__(column, value))
    code, out, err = run_cli(["validate", "--runs", str(runs), "--summary"], capsys)
    assert code == 0 and "Traceback" not in out + err
    assert reason in out
    assert "MAPE overall" in out


def test_a_file_cut_mid_row_scores_the_whole_rows(tmp_path: Path, capsys) -> None:
    cut = tmp_path / "cut.csv"
    cut.write_text(SHIPPED.read_text()[:3000])
    code, out, err = run_cli(["validate", "--runs", str(cut), "--summary"], capsys)
    assert code == 0 and "Traceback" not in out + err
    assert "not stated" in out and "MAPE overall" in out
