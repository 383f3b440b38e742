"""Print how each shipped published run is read: the plan, the assumptions made for
unstated fields, the measured figure, or why the row is not used.

The conversion itself lives in autoconfig/validation/runs.py (so `autoconfig validate` works
from an installed package); its docstring lists the assumptions per source.

    python benchmarks/runs.py
"""

import sys

from tabulate import tabulate

from autoconfig.validation.runs import load_runs
from autoconfig.validation.scoring import default_runs_path


def main() -> int:
    rows = []
    for run in load_runs(default_runs_path()):
        if run.usable:
            p = run.plan
            plan = (f"tp{p.tp} pp{p.pp} dp{p.dp} cp{p.cp} vp{p.vp} mbs{p.mbs} {p.recompute}"
                    f"{' sp' if p.sp else ''}{' distopt' if p.distributed_optimizer else ''}")
            rows.append((run.record_id, run.source_id, run.model_name[:30], run.cluster.gpu.name,
                         plan, f"{run.measure}={run.measured:g}", "; ".join(run.assumptions)))
        else:
            rows.append((run.record_id, run.source_id, run.model_name[:30], "", "not used", "",
                         run.skip_reason))
    print(tabulate(rows, headers=("record", "source", "model", "gpu", "plan", "measured",
                                  "assumptions / reason")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
