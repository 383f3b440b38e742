"""Profiling in rounds: measure a few plans, recalibrate on everything measured,
re-rank the whole grid, measure the best unmeasured plans, and stop when the
measured best is within the tolerance of every unmeasured plan's calibrated
prediction or the run budget is spent.

The first round profiles the predicted best plus diverse plans
(``select.select_plans``: other TP, PP, micro-batch, recompute), which inform
the constants; later rounds the best unmeasured plans by the calibrated
prediction. Every round is written to ``rounds.jsonl`` (what it planned, the
constants it ranked with, the best so far, why the loop stopped) before its
jobs start, so a killed loop resumes the round it was in from the store.
Measurements of the CPU proxy never calibrate GPU predictions: on CPU the
rounds rank with the shipped constants and run until the budget is spent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from autoconfig.core.plan import PlanTable, plan_label
from autoconfig.profiling import store
from autoconfig.profiling.select import select_plans

ROUNDS_FILE = "rounds.jsonl"
DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class RoundState:
    """What the store says so far."""

    finals: dict
    """Plan -> its final record."""
    measured_s: dict
    """Plan -> measured step time of its ok record."""


def state(results_dir: Path, candidates) -> RoundState:
    wanted = set(candidates)
    finals = {}
    for record in store.latest_records(results_dir):
        plan = store.plan_from_record(record)
        if plan in wanted and record.get("status") in store.FINAL_STATUSES:
            finals[plan] = record
    measured = {p: float(r["step_time_s"]) for p, r in finals.items()
                if r.get("status") == "ok" and r.get("step_time_s")}
    return RoundState(finals=finals, measured_s=measured)


def predictions(setting, table: PlanTable, constants) -> np.ndarray:
    """Step time of every candidate plan of ``table`` with ``constants`` (None: the
    shipped ones); ``setting``: (model, workload, cluster, software)."""
    from autoconfig.training.step_time import step_time
    model, workload, cluster, software = setting
    return np.asarray(step_time(model, workload, table, cluster, software=software,
                                constants=constants).step_time_s, dtype=float)


def stop_reason(candidates, predicted_s, st: RoundState, budget_left: int, tolerance: float,
                calibrated: bool) -> str:
    """Why the loop stops now ('' to go on)."""
    unmeasured = [i for i, p in enumerate(candidates) if p not in st.finals]
    if not unmeasured:
        return "every candidate measured"
    if calibrated and st.measured_s:
        best = min(st.measured_s.values())
        fastest = float(np.min(predicted_s[unmeasured]))
        if best <= (1.0 + tolerance) * fastest:
            return (f"proven: the measured best ({best:.4g} s) is within {tolerance:.0%} of "
                    f"every unmeasured plan's calibrated prediction (fastest {fastest:.4g} s)")
    if budget_left <= 0:
        return "run budget spent (--max-runs)"
    return ""


def next_plans(candidates, predicted_s, st: RoundState, k: int, first: bool) -> list:
    """The plans to measure next: the first round the predicted best and diverse
    plans, later the best unmeasured by the calibrated prediction."""
    order = np.argsort(predicted_s, kind="stable")
    unmeasured = [candidates[i] for i in order if candidates[i] not in st.finals]
    if first:
        return select_plans(unmeasured, k)
    return unmeasured[:k]


def load_rounds(results_dir: Path) -> list[dict]:
    """Rounds written so far (unreadable lines skipped: the store is the truth)."""
    path = Path(results_dir) / ROUNDS_FILE
    if not path.exists():
        return []
    rounds = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("round"), int):
            rounds.append(data)
    return rounds


def append_round(results_dir: Path, data: dict) -> None:
    """One line per round event, appended as the store appends a record."""
    store.append_json_line(Path(results_dir) / ROUNDS_FILE, data)


def unfinished_round(results_dir: Path, st: RoundState) -> list:
    """Plans of the last planned round that have no final record yet (a killed
    loop resumes them before planning anew)."""
    rounds = [r for r in load_rounds(results_dir) if r.get("planned")]
    if not rounds or rounds[-1].get("stopped"):
        return []
    plans = [store.plan_from_record(p) for p in rounds[-1]["planned"]]
    return [p for p in plans if p not in st.finals]


def summary(round_number: int, planned, st: RoundState, calibration, predicted_s, candidates,
            reason: str = "") -> dict:
    """The round's line in rounds.jsonl."""
    order = np.argsort(predicted_s, kind="stable")[:5]
    best = min(st.measured_s.items(), key=lambda kv: kv[1]) if st.measured_s else None
    return {"round": round_number, "planned": [p.to_dict() for p in planned],
            "planned_labels": [plan_label(p) for p in planned],
            "runs_used": len(st.finals),
            "constants": ({".".join(k): v for k, v in calibration.values.items()}
                          if calibration is not None else {}),
            "predicted_top": [{"plan": plan_label(candidates[i]),
                               "step_time_s": float(predicted_s[i])} for i in order],
            "best_measured": ({"plan": plan_label(best[0]), "step_time_s": best[1]}
                              if best else None),
            "stopped": reason or None}
