"""What users get is what was validated: for every usable published run,
``autoconfig estimate`` through the CLI, given the run's stack and settings as
flags (``autoconfig.validation.runs.estimate_args``), predicts the same step
time (and, for rows that measured memory, the same memory) as ``validate``."""

import json

import pytest
from click.testing import CliRunner

from autoconfig.cli import cli
from autoconfig.validation.runs import estimate_args, load_runs
from autoconfig.validation.scoring import (default_runs_path, evaluate_rows,
                                           predict_memory_bytes)

RUNS = load_runs(default_runs_path())
USABLE = [r for r in RUNS if r.usable]
MEMORY = [r for r in RUNS if r.memory_usable and r.memory_bytes is not None]


def _estimate(run) -> dict:
    result = CliRunner().invoke(cli, ["estimate", *estimate_args(run), "--format", "json"])
    assert result.exit_code == 0, f"{run.record_id}: {result.output}"
    return json.loads(result.output)


def test_every_usable_row_is_covered() -> None:
    assert len(USABLE) > 300 and len(MEMORY) > 40


def test_estimate_predicts_what_validate_scores_for_every_row() -> None:
    predicted = {r.run.record_id: r.predicted_step_s for r in evaluate_rows(USABLE)}
    mismatches = []
    for run in USABLE:
        step = _estimate(run)["step_time_s"]
        if step != pytest.approx(predicted[run.record_id], rel=1e-9):
            mismatches.append((run.record_id, step, predicted[run.record_id]))
    assert not mismatches, mismatches[:5]


def test_estimate_memory_matches_validate_for_measured_rows() -> None:
    mismatches = []
    for run in MEMORY:
        allocated, device = predict_memory_bytes(run)
        stages = _estimate(run)["memory_by_stage_gib"]
        shown = [stages["last"]] if run.memory_stage == "last" else list(stages.values())
        kind = "allocated" if run.memory_kind == "allocated" else "device"
        got = max(s[kind] for s in shown) * 2**30
        want = allocated if kind == "allocated" else device
        if got != pytest.approx(want, rel=1e-9):
            mismatches.append((run.record_id, got, want))
    assert not mismatches, mismatches[:5]
