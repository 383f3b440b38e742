"""Capacity-planning report rendering: the grid of cells as a table and markdown,
with cost, energy and carbon columns when they were priced."""

import pandas as pd
from tabulate import tabulate

from autoconfig.core.plan import plan_label

COLUMNS = ("gpu", "nodes", "gpus", "status", "tp", "pp", "vp", "cp", "dp", "sp", "mbs",
           "recompute", "distributed_optimizer", "step_time_s", "tokens_per_s_per_gpu",
           "tokens_per_s", "mfu", "memory_gib", "train_days", "gpu_hours", "reason")
COST_COLUMNS = ("tokens", "price_usd_per_gpu_hour", "cost_usd", "tdp_w", "gpu_power_w",
                "node_overhead_w", "pue", "energy_kwh", "energy_mwh", "grid_kg_per_kwh",
                "co2_t", "fastest", "cheapest")
CSV_NAME = "capacity.csv"
MARKDOWN_NAME = "capacity.md"


def capacity_table(cells, costs=None, tokens: float | None = None, tdp_w=None) -> pd.DataFrame:
    """One row per cell; with ``costs`` (from ``training.cost.price_cells``) the
    cost, energy and carbon columns and the fastest/cheapest marks too."""
    df = pd.DataFrame([c.to_row() for c in cells], columns=list(COLUMNS))
    if costs is None:
        return df
    from autoconfig.training.cost import fastest_and_cheapest
    fastest, cheapest = fastest_and_cheapest(cells, costs)
    rows = []
    for i, (cell, cost) in enumerate(zip(cells, costs)):
        row = dict.fromkeys(COST_COLUMNS)
        row.update(tokens=tokens, tdp_w=(tdp_w or {}).get(cell.gpu), fastest=i == fastest,
                   cheapest=i == cheapest)
        if cost is not None:
            row.update({k: getattr(cost, k) for k in ("price_usd_per_gpu_hour", "cost_usd",
                                                      "gpu_power_w", "node_overhead_w", "pue",
                                                      "energy_kwh", "grid_kg_per_kwh",
                                                      "co2_t")})
            if cost.energy_kwh is not None:
                row["energy_mwh"] = cost.energy_kwh / 1000.0
        rows.append(row)
    return pd.concat([df, pd.DataFrame(rows, columns=list(COST_COLUMNS))], axis=1)


def _num(value, spec: str) -> str:
    return "" if value is None or pd.isna(value) else format(value, spec)


def _shown(cells, costs) -> list[list]:
    from autoconfig.training.cost import fastest_and_cheapest
    fastest, cheapest = fastest_and_cheapest(cells, costs) if costs else (None, None)
    rows = []
    for i, c in enumerate(cells):
        if c.status != "ok":
            # The reason where the plan would be: no number column holds text.
            row = [c.gpu, c.nodes, c.gpus, c.status, c.reason.split(":")[0][:60],
                   "", "", "", "", "", ""]
            rows.append(row + ([""] * 4 if costs else []))
            continue
        row = [c.gpu, c.nodes, c.gpus, "ok", plan_label(c.plan), f"{c.step_time_s:.4g}",
               f"{c.tokens_per_s:,.0f}", f"{100 * c.mfu:.1f}", f"{c.memory_gib:.1f}",
               f"{c.train_days:,.1f}", f"{c.gpu_hours:,.0f}"]
        if costs:
            cost = costs[i]
            marks = " ".join(m for m, on in (("**fastest**", i == fastest),
                                             ("**cheapest**", i == cheapest)) if on)
            mwh = None if cost.energy_kwh is None else cost.energy_kwh / 1000
            row += [_num(cost.cost_usd, ",.0f"), _num(mwh, ",.1f"), _num(cost.co2_t, ",.1f"),
                    marks]
        rows.append(row)
    return rows


_HEADERS = ("gpu", "nodes", "GPUs", "status", "best plan", "step s", "tokens/s", "MFU %",
            "GiB/GPU", "days", "GPU-hours")
_COST_HEADERS = ("cost USD", "MWh", "t CO2", "mark")


def markdown(cells, title: str, notes: list[str], costs=None, plots=()) -> str:
    headers = _HEADERS + (_COST_HEADERS if costs else ())
    body = tabulate(_shown(cells, costs), headers=headers, tablefmt="github",
                    disable_numparse=True)
    lines = [f"# {title}", "", *[f"- {n}" for n in notes], "", body, ""]
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines + ([""] if plots else []))
