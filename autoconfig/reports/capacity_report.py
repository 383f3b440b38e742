"""Capacity-planning report rendering: the grid of cells as a table and markdown."""

import pandas as pd
from tabulate import tabulate

from autoconfig.core.plan import plan_label

COLUMNS = ("gpu", "nodes", "gpus", "status", "tp", "pp", "vp", "cp", "dp", "sp", "mbs",
           "recompute", "distributed_optimizer", "step_time_s", "tokens_per_s_per_gpu",
           "tokens_per_s", "mfu", "memory_gib", "train_days", "gpu_hours", "reason")


def capacity_table(cells) -> pd.DataFrame:
    return pd.DataFrame([c.to_row() for c in cells], columns=list(COLUMNS))


def _shown(cells) -> list[list]:
    rows = []
    for c in cells:
        if c.status != "ok":
            rows.append([c.gpu, c.nodes, c.gpus, c.status, "", "", "", "", "", "",
                         c.reason.split(":")[0][:60]])
            continue
        rows.append([c.gpu, c.nodes, c.gpus, "ok", plan_label(c.plan), f"{c.step_time_s:.4g}",
                     f"{c.tokens_per_s:,.0f}", f"{100 * c.mfu:.1f}", f"{c.memory_gib:.1f}",
                     f"{c.train_days:,.1f}", f"{c.gpu_hours:,.0f}"])
    return rows


_HEADERS = ("gpu", "nodes", "GPUs", "status", "best plan", "step s", "tokens/s", "MFU %",
            "GiB/GPU", "days", "GPU-hours")


def markdown(cells, title: str, notes: list[str]) -> str:
    body = tabulate(_shown(cells), headers=_HEADERS, tablefmt="github")
    return "\n".join([f"# {title}", "", *[f"- {n}" for n in notes], "", body, ""])


