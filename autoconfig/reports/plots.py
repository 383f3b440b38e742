"""PNG plots for the reports (search, capacity, sweep, profiling).

matplotlib is imported only when a figure is drawn (``autoconfig.figures``),
so commands run with ``--no-plots`` (and every other command) never load it.
A plot is a picture of numbers already in the CSV beside it: ``safe_plots``
turns any failure into a warning, so plotting never blocks the CSV or the
markdown.
"""

import sys
from pathlib import Path

from autoconfig.errors import shortened
from autoconfig.figures import save, subplots

SEARCH_SCATTER = "plans_throughput_vs_memory.png"
SEARCH_BREAKDOWN = "best_breakdown.png"
CAPACITY_SCALING = "capacity_scaling.png"
CAPACITY_COST = "capacity_cost_vs_days.png"
SWEEP_SCALING = "sweep_scaling.png"
PROFILE_PLOT = "predicted_vs_measured.png"


def safe_plots(fn, *args, **kwargs) -> list[Path]:
    """Run one plotting function; on any failure warn on stderr and return []."""
    try:
        return [Path(p) for p in fn(*args, **kwargs)]
    except Exception as exc:  # noqa: BLE001 - a plot must never block a report
        print(shortened(f"warning: plots not written ({type(exc).__name__}: {exc})"),
              file=sys.stderr)
        return []


def search_plots(table, out_dir: Path, title: str = "", top: int = 10) -> list[Path]:
    """Throughput vs memory of every plan that fits (winner and top ``top``
    marked), and the winner's step-time and memory breakdowns as stacked bars.
    ``table`` is ``SearchResult.table`` (best first)."""
    out_dir = Path(out_dir)
    fig, ax = subplots(figsize=(7, 4.5))
    ax.scatter(table["memory_gib"], table["tokens_per_s_per_gpu"], s=6, alpha=0.35,
               color="tab:gray", label=f"all {len(table)} plans that fit")
    head = table.head(top)
    ax.scatter(head["memory_gib"], head["tokens_per_s_per_gpu"], s=24, color="tab:blue",
               label=f"top {len(head)}")
    ax.scatter(table["memory_gib"].iloc[:1], table["tokens_per_s_per_gpu"].iloc[:1], s=120,
               marker="*", color="tab:red", label="winner", zorder=3)
    ax.set_xlabel("predicted memory per GPU (GiB)")
    ax.set_ylabel("predicted tokens/s per GPU")
    ax.set_title(title or "plans that fit")
    ax.legend(loc="best", fontsize=8)
    scatter = save(fig, out_dir / SEARCH_SCATTER)

    best = table.iloc[0]
    time_cols = [c for c in ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "pp_bubble_s",
                             "pp_p2p_s", "dp_comm_s", "optimizer_s") if c in table.columns]
    mem_cols = [c for c in table.columns if c.endswith("_gib") and c != "memory_gib"]
    fig, axes = subplots(1, 2, figsize=(7, 4.5))
    for ax, cols, label, suffix in ((axes[0], time_cols, "step time (s)", "_s"),
                                    (axes[1], mem_cols, "memory per GPU (GiB)", "_gib")):
        bottom = 0.0
        for col in cols:
            value = float(best[col])
            ax.bar([0], [value], bottom=bottom, label=col[: -len(suffix)])
            bottom += value
        ax.set_xticks([])
        ax.set_ylabel(label)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("winner: predicted breakdown")
    fig.tight_layout()
    return [scatter, save(fig, out_dir / SEARCH_BREAKDOWN)]


def capacity_plots(df, out_dir: Path, title: str = "") -> list[Path]:
    """Tokens/s and days vs node count per GPU type; cost vs days where priced.
    ``df`` is the capacity CSV's table."""
    out_dir = Path(out_dir)
    ok = df[df["status"] == "ok"]
    fig, axes = subplots(1, 2, figsize=(9, 4))
    for gpu, group in ok.groupby("gpu", sort=False):
        group = group.sort_values("nodes")
        axes[0].plot(group["nodes"], group["tokens_per_s"], marker="o", label=gpu)
        axes[1].plot(group["nodes"], group["train_days"], marker="o", label=gpu)
    for ax, label in ((axes[0], "predicted tokens/s (cluster)"), (axes[1], "days to train")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("nodes")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle(title or "capacity")
    fig.tight_layout()
    paths = [save(fig, out_dir / CAPACITY_SCALING)]
    if "cost_usd" in df.columns and ok["cost_usd"].notna().any():
        fig, ax = subplots(figsize=(6, 4))
        priced = ok[ok["cost_usd"].notna()]
        for gpu, group in priced.groupby("gpu", sort=False):
            ax.scatter(group["train_days"], group["cost_usd"], label=gpu)
            for _, row in group.iterrows():
                ax.annotate(f"{int(row['nodes'])}n", (row["train_days"], row["cost_usd"]),
                            fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel("days to train")
        ax.set_ylabel("cost (USD)")
        ax.set_xscale("log")
        ax.legend(fontsize=8)
        ax.set_title("cost vs days")
        paths.append(save(fig, out_dir / CAPACITY_COST))
    return paths


def sweep_plots(df, out_dir: Path) -> list[Path]:
    """Predicted (and measured) tokens/s per GPU vs node count, one panel per
    model, one line per GPU type; below it the days to train the sweep's
    ``tokens`` when the sweep file gives them. ``df`` is the sweep CSV's table."""
    ok = df[df["status"] == "ok"]
    if ok.empty:
        return []
    models = list(dict.fromkeys(ok["model"]))
    days = "train_days" in ok.columns and ok["train_days"].notna().any()
    fig, axes = subplots(2 if days else 1, len(models),
                             figsize=(4 * len(models), 7.2 if days else 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        for label, group in _per_gpu_by_nodes(ok[ok["model"] == model], "max"):
            ax.plot(group["nodes"], group["predicted_tokens_per_s_per_gpu"], marker="o",
                    label=label)
            measured = group["measured_tokens_per_s_per_gpu"].dropna() \
                if "measured_tokens_per_s_per_gpu" in group else []
            if len(measured):
                ax.scatter(group["nodes"], group["measured_tokens_per_s_per_gpu"], marker="x")
        _nodes_axis(ax, "tokens/s per GPU (best plan)")
        ax.set_title(model, fontsize=9)
    if days:
        for ax, model in zip(axes[1], models):
            for label, group in _per_gpu_by_nodes(ok[ok["model"] == model], "min"):
                ax.plot(group["nodes"], group["train_days"], marker="o", label=label)
            _nodes_axis(ax, "days to train the sweep's tokens")
    fig.tight_layout()
    return [save(fig, Path(out_dir) / SWEEP_SCALING)]


def _per_gpu_by_nodes(sub, best: str):
    """(label, one row per node count) per GPU type and precision of a model's rows;
    ``best`` ("max" or "min") picks each node count's best setting."""
    for (gpu, precision), group in sub.groupby(["gpu", "precision"], sort=False):
        yield f"{gpu} {precision}", getattr(group.groupby("nodes", as_index=False),
                                            best)(numeric_only=True)


def _nodes_axis(ax, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes")
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)


def profile_plots(table, out_dir: Path) -> list[Path]:
    """Predicted vs measured step time per profiled plan (the profiling
    report's table). On CPU runs the two are different machines: the plot
    shows the ranking, not an error."""
    ok = table[(table["status"] == "ok") & table["step_time_s"].notna()]
    if ok.empty:
        return []
    fig, ax = subplots(figsize=(max(5, 0.6 * len(ok) + 2), 4))
    x = range(len(ok))
    width = 0.4
    ax.bar([i - width / 2 for i in x], ok["predicted_step_time_s"].fillna(0), width,
           label="predicted")
    ax.bar([i + width / 2 for i in x], ok["step_time_s"], width, label="measured")
    ax.set_xticks(list(x))
    ax.set_xticklabels(ok["plan"], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel("step time (s)")
    ax.legend()
    fig.tight_layout()
    return [save(fig, Path(out_dir) / PROFILE_PLOT)]
