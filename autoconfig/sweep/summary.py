"""The sweep's reports, rebuilt from its per-setting records: ``sweep.csv``
(one row per setting), ``sweep.md``, ``sweep.json`` and plots; ``autoconfig
compare`` reads them back (``autoconfig.sweep.compare.load_run``).
"""

import json
from pathlib import Path

import pandas as pd
from tabulate import tabulate

from autoconfig.atomic import write_atomic
from autoconfig.base.budget import SECONDS_PER_DAY
from autoconfig.sweep.run import MANIFEST
from autoconfig.sweep.spec import overrides_text

CSV_NAME = "sweep.csv"
MARKDOWN_NAME = "sweep.md"
JSON_NAME = "sweep.json"

COLUMNS = ("key", "model", "gpu", "nodes", "gpus", "global_batch_size", "seq_len", "precision",
           "stack", "overrides", "objective", "mode", "status", "best_plan", "tp", "pp", "vp", "cp", "dp",
           "sp", "mbs", "recompute", "distributed_optimizer",
           "predicted_tokens_per_s_per_gpu", "predicted_step_time_s", "predicted_mfu",
           "predicted_memory_gib", "measured_plan", "measured_tokens_per_s_per_gpu",
           "measured_step_time_s", "measured_peak_memory_gib", "measured_device",
           "runner_up_plan", "runner_up_tokens_per_s_per_gpu", "train_days", "reason",
           "elapsed_s")


def record_row(record: dict, tokens: float | None = None) -> dict:
    """One CSV row of a setting record."""
    s = record.get("setting", {})
    row = dict.fromkeys(COLUMNS)
    row.update(key=record["key"], model=s.get("model"), gpu=s.get("gpu"), nodes=s.get("nodes"),
               precision=s.get("precision"), stack=s.get("stack"),
               overrides=overrides_text(s.get("overrides")), objective=s.get("objective"),
               mode=s.get("mode"), status=record.get("status"),
               reason=_one_line(record.get("reason", "")), elapsed_s=record.get("elapsed_s"),
               gpus=record.get("gpus"), global_batch_size=record.get("global_batch_size"),
               seq_len=record.get("seq_len"))
    best = record.get("best")
    if best:
        plan = best["plan"]
        row.update({k: plan.get(k) for k in ("tp", "pp", "vp", "cp", "dp", "sp", "mbs",
                                             "recompute", "distributed_optimizer")})
        pred = best["predicted"]
        row.update(best_plan=best["label"],
                   predicted_tokens_per_s_per_gpu=pred["tokens_per_s_per_gpu"],
                   predicted_step_time_s=pred["step_time_s"], predicted_mfu=pred["mfu"],
                   predicted_memory_gib=pred["memory_gib"])
        if tokens and row["gpus"]:
            row["train_days"] = tokens / (pred["tokens_per_s_per_gpu"] * row["gpus"]) \
                / SECONDS_PER_DAY
    runner = record.get("runner_up")
    if runner:
        row.update(runner_up_plan=runner["label"],
                   runner_up_tokens_per_s_per_gpu=runner["predicted"]["tokens_per_s_per_gpu"])
    measured = record.get("measured") or {}
    row.update(measured_plan=measured.get("label"),
               measured_tokens_per_s_per_gpu=measured.get("tokens_per_s_per_gpu"),
               measured_step_time_s=measured.get("step_time_s"),
               measured_peak_memory_gib=measured.get("peak_memory_gib"),
               measured_device=measured.get("device"))
    return row


def sweep_table(records: list[dict], tokens: float | None = None) -> pd.DataFrame:
    return pd.DataFrame([record_row(r, tokens) for r in records], columns=list(COLUMNS))


def render_markdown(df: pd.DataFrame, name: str, manifest: dict, plots=()) -> str:
    counts = df["status"].value_counts().to_dict()
    lines = [f"# Sweep {name}", "",
             f"- {len(df)} settings: " + ", ".join(f"{n} {s}" for s, n in counts.items()),
             f"- autoconfig {manifest.get('autoconfig_version')}, commit "
             f"{manifest.get('git_commit') or 'unknown'}, started {manifest.get('created_at')} "
             f"on {manifest.get('host')}",
             "- predictions from the analytical model; measured figures only where a setting "
             "was profiled (CPU proxy figures are not GPU figures)", ""]
    # The stack column only where settings differ in it: most sweeps use one.
    stacks = df["stack"].fillna("") + df["overrides"].fillna("").map(
        lambda flags: f" {flags}" if flags else "")
    varied = stacks.nunique() > 1
    rows = []
    for r, stack in zip(df.itertuples(index=False), stacks):
        rows.append([r.model, r.gpu, r.nodes, r.precision, *([stack] if varied else []),
                     r.mode, r.status, _s(r.best_plan),
                     _fmt(r.predicted_tokens_per_s_per_gpu, ",.0f"),
                     _fmt(r.measured_tokens_per_s_per_gpu, ",.4g"),
                     _fmt(r.predicted_step_time_s, ".4g"),
                     _fmt(None if r.predicted_mfu is None else 100 * r.predicted_mfu, ".1f"),
                     _fmt(r.predicted_memory_gib, ".1f"), _s(r.runner_up_plan),
                     _s(r.reason)[:80]])
    lines.append(tabulate(rows, headers=("model", "gpu", "nodes", "prec",
                                         *(["stack"] if varied else []), "mode", "status",
                                         "best plan", "pred tok/s/GPU", "meas tok/s/GPU",
                                         "pred step s", "MFU %", "GiB/GPU", "runner-up",
                                         "reason"), tablefmt="github"))
    lines.append("")
    lines += [f"![{p.stem}]({p.name})" for p in plots]
    return "\n".join(lines) + "\n"


def write_summary(out_dir: Path, records: list[dict], name: str, tokens: float | None = None,
                  plots: bool = True) -> dict[str, Path]:
    """sweep.csv, plots, sweep.md and sweep.json; returns name -> path."""
    out_dir = Path(out_dir)
    manifest = _read_json(out_dir / MANIFEST)
    df = sweep_table(records, tokens)
    files = {"csv": write_atomic(out_dir / CSV_NAME, df.to_csv(index=False,
                                                               lineterminator="\n"))}
    drawn = []
    if plots:
        from autoconfig.reports.plots import safe_plots, sweep_plots
        drawn = safe_plots(sweep_plots, df, out_dir)
    files["markdown"] = write_atomic(out_dir / MARKDOWN_NAME,
                                     render_markdown(df, name, manifest, drawn))
    document = {"name": name, "manifest": manifest, "settings": records}
    files["json"] = write_atomic(out_dir / JSON_NAME, json.dumps(document, indent=2) + "\n")
    files.update({p.stem: p for p in drawn})
    return files


def _read_json(path: Path) -> dict:
    """A JSON object from a file; {} when unreadable, not JSON, not UTF-8 or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return format(value, spec)


def _s(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())
