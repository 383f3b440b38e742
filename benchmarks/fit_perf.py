"""Fit the free constants of the step-time model on the shipped published runs.

The fitting itself is ``autoconfig.validation.calibration.fit`` (the same code
the leave-one-source-out cross-validation of ``autoconfig validate
--cross-validate`` refits with); this script prints the fitted values, the loss
and MAPE per source, and with ``--write`` puts the values into
heuristics/perf.yaml (their sources there name the rows they were fitted on).

    python benchmarks/fit_perf.py           # ~1-2 min on 2 cores
    python benchmarks/fit_perf.py --write
"""

import re
import sys
import time

import numpy as np

from autoconfig.paths import heuristics_dir
from autoconfig.training.step_time import load_constants
from autoconfig.validation.calibration import FREE, fit, get_value, loss
from autoconfig.validation.runs import load_runs
from autoconfig.validation.scoring import default_runs_path, evaluate_rows


def _write(values: dict) -> None:
    path = heuristics_dir() / "perf.yaml"
    text = path.read_text()
    ampere = ("gemm_efficiency_max", "ampere")
    if ampere in values:
        # Ada has no rows of its own and takes Ampere's value (its source says why).
        values = {**values, ("gemm_efficiency_max", "ada"): values[ampere]}
    for key, value in values.items():
        text = _replace(text, key, value)
    path.write_text(text)


def _replace(text: str, key: tuple[str, ...], value: float) -> str:
    """Replace the value of ``key`` (a path of YAML mapping keys) in perf.yaml's
    text, keeping its comments and sources: walk the lines, tracking the key path
    by indentation, and rewrite the ``value:`` of the matching entry."""
    lines = text.split("\n")
    path: list[tuple[int, str]] = []
    for n, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        name = stripped.split(":", 1)[0]
        while path and path[-1][0] >= indent:
            path.pop()
        if name == "value" and tuple(k for _, k in path) == key:
            lines[n] = re.sub(r"value: [0-9.eE+-]+", f"value: {value:.4g}", line, count=1)
            return "\n".join(lines)
        if tuple(k for _, k in path) + (name,) == key and "value:" in stripped:
            lines[n] = re.sub(r"value: [0-9.eE+-]+", f"value: {value:.4g}", line, count=1)
            return "\n".join(lines)
        path.append((indent, name))
    raise SystemExit(f"could not find {'.'.join(key)} in perf.yaml")


def main(argv: list[str]) -> int:
    start = time.time()
    base = load_constants()
    runs = [r for r in load_runs(default_runs_path()) if r.usable and r.throughput_benchmark]
    fitted = fit(runs, base)
    rows = evaluate_rows(runs, fitted)
    by_source: dict[str, list[float]] = {}
    for r in rows:
        by_source.setdefault(r.run.source_id, []).append(r.abs_pct_error)
    values = {k: get_value(fitted, k) for k in FREE}
    for k, v in values.items():
        print(f"{'.'.join(k)}: {v:.4g}")
    print(f"loss (source-balanced mean absolute log ratio): {loss(runs, fitted):.5f} "
          f"(before: {loss(runs, base):.5f}); MAPE {np.mean([r.abs_pct_error for r in rows]):.1f}% "
          f"over {len(rows)} rows; " + ", ".join(f"{s} {np.mean(e):.1f}%"
                                               for s, e in sorted(by_source.items())))
    if "--write" in argv:
        _write(values)
        print("wrote heuristics/perf.yaml")
    print(f"({time.time() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
