"""How good is profiling in rounds? Replay every published topology search.

Each setting of benchmarks/published_runs.csv with several plans measured
(same source, model shape, GPUs and batch: ``validation.scoring.group_key``; at
least MIN_PLANS distinct plans) is a grid whose every cell has a measurement.
The round loop of ``autoconfig search --profile --max-runs`` (the functions of
``autoconfig.profiling.rounds`` and ``autoconfig.profiling.calibrate``) is run
on it with the measurements answering each run, and the script prints, per
search:

- the grid size, the runs the loop used before it stopped and the run at
  which it first measured a plan within 2% of the grid's best ("hit");
- whether the measured best of the loop is within 2% of the grid's best;
- the runs the uncalibrated predicted order needs to reach a plan within 2%
  of the best (the incumbent top-k), and the expected runs of a random order;
- Spearman of calibrated vs measured step time on the plans not profiled, and
  after calibrating on the loop's first 5 measured plans.

Where a plan was measured more than once in a setting, its median counts.
Usage: python benchmarks/profiling_efficiency.py [--max-runs 8] [--per-round 3]
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoconfig.profiling import calibrate, rounds  # noqa: E402
from autoconfig.validation.runs import load_runs  # noqa: E402
from autoconfig.validation.scoring import (default_runs_path, evaluate_rows, group_key,  # noqa: E402
                                           spearman)

MIN_PLANS = 3
WITHIN = 0.02


def settings(runs):
    """group key -> {plan: representative Run (its measured step time the median)}."""
    groups = {}
    for row in evaluate_rows([r for r in runs if r.usable]):
        groups.setdefault(group_key(row.run), {}).setdefault(row.run.plan, []).append(row)
    out = {}
    for key, plans in groups.items():
        if len(plans) < MIN_PLANS:
            continue
        out[key] = {plan: (rows[0].run, statistics.median(r.measured_step_s for r in rows))
                    for plan, rows in plans.items()}
    return out


def predicted(members, constants) -> np.ndarray:
    return np.array([r.predicted_step_s for r in evaluate_rows([m for m, _ in members],
                                                               constants)])


def replay_loop(cells: dict, max_runs: int, per_round: int, tolerance: float = WITHIN):
    """(plans measured in order, stop reason, final constants) of the round loop."""
    plans = list(cells)
    members = [cells[p] for p in plans]
    shipped = predicted(members, None)
    finals, order, number, constants, fitted = {}, [], 0, None, None
    while True:
        measured = {p: cells[p][1] for p in finals}
        st = rounds.RoundState(finals=finals, measured_s=measured)
        pred = shipped if constants is None else predicted(members, constants)
        reason = rounds.stop_reason(plans, pred, st, max_runs - len(finals), tolerance,
                                    constants is not None and number >= 2)
        if reason:
            return order, reason, fitted
        number += 1
        chosen = rounds.next_plans(plans, pred, st, min(per_round, max_runs - len(finals)),
                                   first=number == 1)
        for p in chosen:
            finals[p] = {"status": "ok"}
            order.append(p)
        fitted = calibrate.calibrate([_as_measured(cells[p]) for p in finals])
        constants = fitted.constants()


def _as_measured(cell):
    """The published run with its (median) measured figure as a step time."""
    import dataclasses
    run, step = cell
    return dataclasses.replace(run, measure="step_time_s", measured=step)


def runs_to_best(order_steps: list[float], best: float) -> int:
    for i, step in enumerate(order_steps, start=1):
        if step <= best * (1 + WITHIN):
            return i
    return len(order_steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-runs", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=3)
    args = parser.parse_args()
    started = time.perf_counter()
    groups = settings(load_runs(default_runs_path()))
    print(f"{'setting':<52} {'grid':>4} {'used':>4} {'hit':>4} {'found':>5} {'top-k':>5} "
          f"{'random':>6} {'rho rest':>8} {'rho@5':>6}")
    for key, cells in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        plans = list(cells)
        steps = np.array([cells[p][1] for p in plans])
        best = float(steps.min())
        order, _, fitted = replay_loop(cells, args.max_runs, args.per_round)
        found = min(cells[p][1] for p in order) <= best * (1 + WITHIN)
        shipped = predicted([cells[p] for p in plans], None)
        topk = runs_to_best(list(steps[np.argsort(shipped, kind="stable")]), best)
        good = int((steps <= best * (1 + WITHIN)).sum())
        random_runs = (len(plans) + 1) / (good + 1)
        rest = [p for p in plans if p not in order]
        rho_rest = _rho(cells, rest, fitted.constants() if fitted else None)
        first5 = calibrate.calibrate([_as_measured(cells[p]) for p in order[:5]])
        rho5 = _rho(cells, [p for p in plans if p not in order[:5]], first5.constants())
        hit = runs_to_best([cells[p][1] for p in order], best)
        print(f"{key[:52]:<52} {len(plans):>4} {len(order):>4} {hit if found else '-':>4} "
              f"{'yes' if found else 'no':>5} {topk:>5} {random_runs:>6.1f} {rho_rest:>8.2f} "
              f"{rho5:>6.2f}")
    print(f"\n{len(groups)} published searches replayed in {time.perf_counter() - started:.1f} s "
          f"(max runs {args.max_runs}, {args.per_round} per round, tolerance {WITHIN:.0%})")


def _rho(cells, plans, constants) -> float:
    if len(plans) < 3:
        return float("nan")
    pred = predicted([cells[p] for p in plans], constants)
    return spearman(pred, [cells[p][1] for p in plans])


if __name__ == "__main__":
    main()
