"""The profiling report: measured beside predicted, failures with their reason.

Built only from a results directory (``plans.csv``, ``results.jsonl``,
``meta.json``), so ``autoconfig report DIR`` can rebuild it at any time. It
never fails on odd content: an empty or all-failed store gives a report that
says so and what to change.
"""

from pathlib import Path

import numpy as np
import pandas as pd

from autoconfig.core.plan import PLAN_FIELDS, Plan, plan_label
from autoconfig.profiling import store
from autoconfig.profiling.rank import rank_measured
from autoconfig.units import GIB, optional_float

REPORT_CSV = "profile_report.csv"
REPORT_MD = "profile_report.md"

CPU_NOTE = ("CPU run: every plan ran on a scaled-down proxy of the model on CPU (gloo). These figures "
            "rank plans against each other and prove they run; they are NOT GPU figures, so no "
            "error against the GPU prediction is given.")

ADVICE = {
    "oom": "out of memory: profile plans with more recompute, a smaller micro-batch or more TP/PP "
           "(or search with --recompute full --mbs 1)",
    "timeout": "time limit hit: raise --max-minutes/--time-limit (or lower --max-steps/"
               "--warmup-steps) and re-run the same command with --retry timeout",
    "error": "jobs raised: read the error lines above; check that torch and megatron-core are "
             "installed where the jobs run (pip install 'autoconfig[profile]'), then re-run "
             "with --retry error",
    "cancelled": "jobs were cancelled: re-run the same command (or --resume DIR) to finish them",
    "node_fail": "a node failed: exclude it (--slurm-extra exclude=NODE) and re-run the same "
                 "command (or --resume DIR)",
}


def _plan_of(row: dict) -> Plan | None:
    try:
        return store.plan_from_record(row)
    except Exception:  # noqa: BLE001 - a malformed row is skipped, not fatal
        return None


def build_table(out_dir: Path, objective: str = "throughput") -> pd.DataFrame:
    """One row per profiled (or selected) plan: measured, predicted, error."""
    out_dir = Path(out_dir)
    plans = store.load_plans(out_dir)
    results = store.load_results(out_dir)
    predicted: dict[Plan, dict] = {}
    for row in plans.to_dict("records"):
        plan = _plan_of(row)
        if plan is not None:
            predicted[plan] = row
    rows = []
    seen = set()
    for row in results.to_dict("records"):
        plan = _plan_of(row)
        if plan is None:
            continue
        seen.add(plan)
        rows.append(_row(plan, row, predicted.get(plan, {})))
    for plan, pred in predicted.items():
        if plan not in seen and _truthy(pred.get("selected", False)):
            rows.append(_row(plan, {"status": "not run", "error": ""}, pred))
    table = pd.DataFrame(rows, columns=_COLUMNS)
    table["_row"] = np.arange(len(table))
    ranked = rank_measured(table, objective)
    table = table.merge(ranked[["_row", "measured_rank"]], on="_row", how="left").drop(columns="_row")
    table["measured_rank"] = table["measured_rank"].astype("Int64")
    order = np.lexsort((table["predicted_rank"].fillna(np.inf).to_numpy(dtype=float),
                        table["measured_rank"].astype("Float64").fillna(np.inf).to_numpy(dtype=float)))
    table = table.iloc[order].reset_index(drop=True)
    return table[["measured_rank"] + _COLUMNS]


_COLUMNS = ["predicted_rank", "plan", *PLAN_FIELDS, "status", "device", "world_size",
            "step_time_s", "predicted_step_time_s", "step_time_error_pct",
            "tokens_per_s_per_gpu", "predicted_tokens_per_s_per_gpu", "tokens_error_pct",
            "model_tflops_per_gpu", "peak_memory_gib", "predicted_memory_gib",
            "peak_allocated_gib", "first_loss", "moe_dispatcher", "run_notes", "error"]


def _row(plan: Plan, result: dict, pred: dict) -> dict:
    device = result.get("device") or ""
    step = optional_float(result.get("step_time_s"))
    tokens = optional_float(result.get("tokens_per_s_per_gpu"))
    pred_step = optional_float(pred.get("predicted_step_time_s"))
    pred_tokens = optional_float(pred.get("predicted_tokens_per_s_per_gpu"))
    comparable = device == "cuda"
    losses = result.get("losses") or []
    peak = optional_float(result.get("peak_memory_bytes"))
    allocated = optional_float(result.get("peak_allocated_bytes"))
    row = {name: getattr(plan, name) for name in PLAN_FIELDS}
    row.update(
        predicted_rank=optional_float(pred.get("predicted_rank")), plan=plan_label(plan),
        status=result.get("status", "error"), device=device,
        world_size=result.get("world_size"),
        step_time_s=step, predicted_step_time_s=pred_step,
        step_time_error_pct=_error_pct(step, pred_step) if comparable else None,
        tokens_per_s_per_gpu=tokens, predicted_tokens_per_s_per_gpu=pred_tokens,
        tokens_error_pct=_error_pct(tokens, pred_tokens) if comparable else None,
        model_tflops_per_gpu=optional_float(result.get("model_tflops_per_gpu")),
        peak_memory_gib=None if peak is None else peak / GIB,
        predicted_memory_gib=optional_float(pred.get("predicted_memory_gib")),
        peak_allocated_gib=None if allocated is None else allocated / GIB,
        first_loss=optional_float(losses[0]) if isinstance(losses, list) and losses else None,
        moe_dispatcher=_text(result.get("moe_dispatcher")),
        run_notes=_text(result.get("run_notes")),
        error=_one_line(result.get("error") or ""),
    )
    return row


def render_markdown(table: pd.DataFrame, meta: dict, objective: str,
                    results_file: Path | str = store.RESULTS_FILE) -> str:
    """The report; ``results_file`` is named when no job result is in it."""
    lines = ["# Profiling report", ""]
    model = meta.get("model")   # a damaged meta.json may hold anything here
    what = meta.get("model_name") or (model.get("name", "?") if isinstance(model, dict)
                                      else str(model or "?"))
    ran = meta.get("proxy_model_name")
    lines.append(f"Model {what}" + (f" (ran as proxy {ran})" if ran else "") +
                 f", device {meta.get('device', '?')}, executor {meta.get('executor', '?')}, "
                 f"objective {objective} "
                 f"({'tokens/s per GPU, highest first' if objective == 'throughput' else 'step time, lowest first'}).")
    lines.append("")
    if meta.get("device") == "cpu" or (not table.empty and (table["device"] == "cpu").any()):
        lines += [f"> {CPU_NOTE}", ""]
    ok = table[table["status"] == "ok"]
    failed = table[~table["status"].isin(["ok", "not run"])]
    pending = table[table["status"] == "not run"]
    lines.append(f"{len(table)} plans: {len(ok)} ok, {len(failed)} failed, {len(pending)} not run yet.")
    lines.append("")
    if len(ok):
        lines += ["## Measured ranking", ""]
        head = ["rank", "predicted rank", "plan", "step time s (pred)", "err %",
                "tokens/s/GPU (pred)", "err %", "TFLOP/s/GPU", "peak GiB (pred)", "first loss"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for _, r in ok.iterrows():
            lines.append("| " + " | ".join([
                _fmt(r["measured_rank"], "d"), _fmt(r["predicted_rank"], "d"), r["plan"],
                f"{_fmt(r['step_time_s'], '.4g')} ({_fmt(r['predicted_step_time_s'], '.4g')})",
                _fmt(r["step_time_error_pct"], "+.1f"),
                f"{_fmt(r['tokens_per_s_per_gpu'], '.4g')} ({_fmt(r['predicted_tokens_per_s_per_gpu'], '.4g')})",
                _fmt(r["tokens_error_pct"], "+.1f"), _fmt(r["model_tflops_per_gpu"], ".3g"),
                f"{_fmt(r['peak_memory_gib'], '.3g')} ({_fmt(r['predicted_memory_gib'], '.3g')})",
                _fmt(r["first_loss"], ".5g")]) + " |")
        lines.append("")
        best = ok.iloc[0]
        lines += [f"Fastest measured: **{best['plan']}**"
                  + (f" (predicted rank {int(best['predicted_rank'])})."
                     if pd.notna(best["predicted_rank"]) else "."), ""]
    ran = table[table["status"] != "not run"]
    changed = ran[ran["run_notes"].astype(str).str.strip() != ""]
    if len(ran) and (ran["moe_dispatcher"].astype(str).str.strip() != "").any():
        used = ", ".join(sorted({str(d) for d in ran["moe_dispatcher"] if str(d).strip()}))
        lines += [f"MoE token dispatcher run: {used}.", ""]
    if len(changed):
        lines += ["## What the runs changed", "", "| plan | change |", "|---|---|"]
        for _, r in changed.iterrows():
            lines.append(f"| {r['plan']} | {_md(r['run_notes'])} |")
        lines.append("")
    if len(failed):
        lines += ["## Failures", "", "| plan | status | reason |", "|---|---|---|"]
        for _, r in failed.iterrows():
            lines.append(f"| {r['plan']} | {r['status']} | {_md(r['error']) or '-'} |")
        lines.append("")
    if len(pending):
        lines += ["## Not run yet", "", "Re-run with `--resume DIR` to profile: " +
                  ", ".join(pending["plan"]) + ".", ""]
    if not len(ok):
        lines += ["## No plan ran successfully", ""]
        if ran.empty:   # only plans not run yet: none failed, none reported
            lines.append(f"No profiling job has reported yet: no job results were found in "
                         f"{results_file}. Check that jobs were submitted (the jobs/ folder "
                         "holds their logs) and re-run with --resume DIR.")
        else:
            lines.append(f"Every one of the {len(failed)} profiling jobs failed. What to change:")
            for status in sorted(set(failed["status"])):
                advice = ADVICE.get(status, ADVICE["error"])
                if advice is ADVICE["error"] and meta.get("device") != "cpu":
                    advice += ", or try --device cpu"   # never said when the run was on cpu
                lines.append(f"- {status} ({int((failed['status'] == status).sum())}): {advice}")
        lines.append("")
    return "\n".join(lines)


def render_rounds(rounds: list[dict]) -> str:
    """The rounds of a --max-runs run: what each measured, the constants it
    ranked with, the predicted top and the best so far, and why it stopped."""
    if not rounds:
        return ""
    lines = ["", "## Rounds", "", "| round | runs before | profiled | constants | predicted top "
             "| best measured |", "|---|---|---|---|---|---|"]
    stopped = ""
    for r in rounds:
        if r.get("stopped"):
            stopped = str(r["stopped"])
        if not r.get("planned"):
            continue
        constants = ", ".join(f"{k} {v:.4g}" for k, v in (r.get("constants") or {}).items())
        top = ", ".join(f"{t['plan']} ({t['step_time_s']:.3g} s)"
                        for t in (r.get("predicted_top") or [])[:3])
        best = r.get("best_measured") or {}
        lines.append(f"| {r['round']} | {r.get('runs_used', '')} | "
                     f"{_md(', '.join(r.get('planned_labels') or []))} | "
                     f"{_md(constants) or 'shipped'} | {_md(top)} | "
                     f"{_md(best.get('plan', '-'))}"
                     + (f" ({best['step_time_s']:.4g} s)" if best else "") + " |")
    lines += ["", f"Stopped: {stopped}." if stopped else "Not finished: run the same command "
              "again to go on from the store.", ""]
    return "\n".join(lines)


def write_report(out_dir: Path, objective: str | None = None,
                 plots: bool = True) -> tuple[Path, Path, pd.DataFrame]:
    """Write profile_report.csv and profile_report.md into ``out_dir`` (and the
    predicted-vs-measured plot, linked from the markdown)."""
    out_dir = Path(out_dir)
    meta = store.load_meta(out_dir)
    objective = objective or meta.get("objective", "throughput")
    table = build_table(out_dir, objective)
    csv_path, md_path = out_dir / REPORT_CSV, out_dir / REPORT_MD
    table.to_csv(csv_path, index=False)
    drawn = []
    if plots:
        from autoconfig.reports.plots import profile_plots, safe_plots
        drawn = safe_plots(profile_plots, table, out_dir)
    from autoconfig.profiling.rounds import load_rounds
    md_path.write_text(render_markdown(table, meta, objective, out_dir / store.RESULTS_FILE)
                       + render_rounds(load_rounds(out_dir))
                       + "".join(f"\n![{p.stem}]({p.name})\n" for p in drawn))
    return csv_path, md_path, table


def _text(value) -> str:
    """A record's text field; absent (older records) or NaN (a CSV cell) is empty."""
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return ""
    return str(value)


def _truthy(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value) and not (isinstance(value, float) and np.isnan(value))


def _error_pct(measured: float | None, predicted: float | None) -> float | None:
    """(predicted - measured) / measured, in percent."""
    if measured is None or predicted is None or measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _md(text: str) -> str:
    return str(text).replace("|", "\\|")


def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and np.isnan(value)) or value is pd.NA:
        return "-"
    try:
        return format(int(value) if spec == "d" else float(value), spec)
    except (TypeError, ValueError):
        return str(value)
