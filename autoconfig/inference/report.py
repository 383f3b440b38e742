"""Writers for an inference search: ``infer.csv``, ``infer.md``, ``infer.json`` and
a PNG of the throughput-latency Pareto front.

Text files are written atomically (``autoconfig.atomic.write_atomic``) and carry
no timestamp. matplotlib is imported only when plotting, and a plot that
fails never blocks the text files: it is reported as skipped.
"""

import json
import math
from pathlib import Path

from tabulate import tabulate

from autoconfig.atomic import write_atomic
from autoconfig.core.model import active_params, total_params
from autoconfig.inference.engine import fp8_prompt_attention, get_engine
from autoconfig.inference.latency import step_kernels
from autoconfig.inference.rate_search import STEEP_LOAD
from autoconfig.inference.search import InferenceSearchResult
from autoconfig.units import format_count

CSV_NAME = "infer.csv"
MARKDOWN_NAME = "infer.md"
JSON_NAME = "infer.json"
PLOT_NAME = "infer_pareto.png"

TOP_HEADERS = ("#", "TP", "PP", "batch", "replicas", "TTFT ms", "TPOT ms", "latency ms",
               "tok/s/replica", "tok/s/GPU", "tok/s total", "req/s total", "mem GiB/GPU",
               "Pareto")


def _split(result: InferenceSearchResult) -> bool:
    return "prefill_instances" in result.table.columns


def top_headers(result: InferenceSearchResult) -> tuple[str, ...]:
    """TOP_HEADERS, with EP after PP for an MoE model, the serving split when asked
    and a job's duration and tail (p99 over its requests)."""
    headers = TOP_HEADERS[:3] + ("EP",) + TOP_HEADERS[3:] if result.model.is_moe \
        else TOP_HEADERS
    headers = headers + ("prefill pool",) if _split(result) else headers
    if result.job is None:
        return headers
    return headers + ("job s", "TTFT p99 ms", "TPOT p99 ms") \
        + (("rate/s", "load %") if result.job.rate_search else ())


def _pool(r) -> str:
    """``4 x tp2 pp1 b2`` for a disaggregated row's prefill pool, '' for aggregated serving."""
    if getattr(r, "serving", "aggregated") != "disaggregated":
        return "-"
    return (f"{int(r.prefill_instances)} x tp{int(r.prefill_tp)} pp{int(r.prefill_pp)} "
            f"b{int(r.prefill_batch)}")


def top_rows(result: InferenceSearchResult, n: int) -> list[tuple]:
    moe = result.model.is_moe
    split = _split(result)
    return [(i + 1, r.tp, r.pp, *((r.ep,) if moe else ()), r.batch, r.replicas,
             f"{r.ttft_ms:.4g}", f"{r.tpot_ms:.4g}",
             f"{r.latency_ms:.5g}", f"{r.tokens_per_s_per_replica:.5g}",
             f"{r.tokens_per_s_per_gpu:.4g}", f"{r.tokens_per_s_total:.5g}",
             f"{r.requests_per_s_total:.4g}", f"{r.memory_gib:.1f}", "*" if r.pareto else "",
             *((_pool(r),) if split else ()),
             *((f"{r.job_duration_s:.4g}", f"{r.ttft_p99_ms:.4g}", f"{r.tpot_p99_ms:.4g}")
               if result.job is not None else ()),
             *((f"{r.request_rate_per_s:.4g}", _percent(r.load_fraction))
               if _searched(result) else ()))
            for i, r in enumerate(result.table.head(n).itertuples(index=False))]


def engine_line(result: InferenceSearchResult, is_default: bool) -> str:
    """Which engine and batching the numbers describe (the default says why it is one)."""
    from autoconfig.inference.engine import DEFAULT_REASON

    e = result.engine
    if e is None:
        return ""
    why = f" (the default: {DEFAULT_REASON}; --engine picks another)" if is_default else ""
    what = ("continuous batching at steady state: 'batch' is the requests in flight per "
            "replica" if result.mode == "continuous" else
            "static batches: 'batch' requests served together")
    if result.job is not None:
        job = _job_text(result.job, result.limits, result.workload.dispatch)
        what = (f"continuous batching of a job of {job}: "
                "'batch' is the engine's cap on running sequences per replica, times are "
                "means over the job's requests (p99: their 99th percentile; the csv and json add the "
                "medians and the inter-token gaps pooled over the requests, itl), "
                "throughput over its whole duration")
    if e.decode_steps > 1:
        what += (f"; {e.decode_steps} decode steps per scheduler call "
                 f"({e.decode_steps_option} {e.decode_steps})")
    if e.continuous and result.mode == "continuous" and not e.mixed_prefill:
        what += "; prefill-first: a prefill runs alone and the decodes wait for it"
    if e.continuous and e.overlap_schedule:
        what += ("; the scheduler builds each step while the one before runs: a new request "
                 "waits a step longer")
    if e.gemm_allreduce_fusion:
        what += ("; each row-parallel GEMM runs fused with its all-reduce, which hides under "
                 f"it inside one NVLink domain on {', '.join(e.gemm_fusion_generations)} GPUs")
    if fp8_prompt_attention(e, result.workload.precision, result.cluster.gpu.generation):
        what += "; the prompts' attention runs in FP8 (context FMHA)"
    if not e.pipeline_split.decode_overlaps_steps and (result.table["pp"] > 1).any():
        what += ("; with pipeline stages each step crosses them in turn before the next "
                 "starts (no micro-batches in flight across steps), so a stage idles while "
                 "the others work")
    if not e.prefill_samples_first_token:
        what += ("; a prompt's first token comes from the decode step after its prefill "
                 "(the prefill stops one token short)")
    if e.graph_steps is not None:
        below, from_tp4, prefill = e.graph_steps
        caps = f"{below}" if below == from_tp4 else f"{below} ({from_tp4} from TP 4)"
        what += (f"; decode batches up to {caps} replay CUDA graphs, larger ones"
                 + ("" if prefill else " and prefills") + " launch every kernel eagerly "
                 "(--cuda-graph-max-batch)")
    default = get_engine(e.name)
    if e.continuous and e.max_batched_tokens != default.max_batched_tokens:
        what += f"; {e.max_batched_tokens} tokens a step at most"
    if e.kv_cache_tokens is not None:
        what += f"; a KV pool of {e.kv_cache_tokens} tokens per replica"
    if e.kv_pool is not None and e.kv_cache_tokens is None and e.kv_pool != default.kv_pool:
        what += f"; a KV memory share of {e.kv_pool.share:g}"
    if e.continuous and e.chunked_prefill != default.chunked_prefill:
        what += ("; prompts chunked to fill each step's budget" if e.chunked_prefill else
                 "; prompts prefilled whole")
    if e.continuous and e.kv_policy != default.kv_policy:
        what += {"reserve": "; a request is admitted only when the KV cache holds its whole "
                            "output",
                 "preempt": "; requests admitted against their prompt, the newest evicted "
                            "and recomputed when the KV cache fills",
                 "estimate": "; requests admitted against their prompt and an estimate of "
                             "the outputs to come, the newest retracted when the KV cache "
                             "fills",
                 "exact": "; a request is admitted only when every admitted request can "
                          "still finish without an eviction"}[e.kv_policy]
    return f"engine: {e.name}, {e.display_name} {e.version}{why}; {what}"


def _percent(fraction: float) -> str:
    return "-" if math.isnan(fraction) else f"{100 * fraction:.0f}"


def load_line(result: InferenceSearchResult) -> str:
    """A warning when the best layout's searched rate is at ``STEEP_LOAD`` of the
    rate it completes with the job sent at once, or above it
    (``autoconfig.inference.rate_search``), else ''."""
    if not _searched(result) or result.table.empty:
        return ""
    best = result.table.iloc[0]
    load = float(best.load_fraction)
    if math.isnan(load) or load < STEEP_LOAD:
        return ""
    if load >= 1.0:
        return (f"note: the best layout's rate, {best.request_rate_per_s:.4g}/s, is "
                f"{100 * load:.0f}% of what it completes with the job sent at once: over "
                f"{result.job.requests} requests its queue stays within the limits, but a "
                "longer run at this rate may keep queueing; for a server that runs for "
                "minutes, check with --num-requests as the rate times the run's seconds")
    return (f"note: the best layout's rate is {100 * load:.0f}% of what it completes with "
            f"the job sent at once; this near full load a {100 * (1 - load):.0f}% error in "
            "the rate or in the step cost moves TTFT and TPOT by about their whole value: "
            "plan on the rate, not on the latencies")


def graph_line(result: InferenceSearchResult) -> str:
    """A note when the best layout's running batch at steady state is past the
    decode batch its engine replays as a CUDA graph (``Engine.graph_steps``), else ''."""
    e = result.engine
    if e is None or e.graph_steps is None or result.mode != "continuous" \
            or result.job is not None or result.table.empty:
        return ""
    best = result.table.iloc[0]
    running = float(best.batch) / float(best.pp)            # one micro-batch of a stage
    cap = float(e.graph_max_seqs(int(best.tp)))
    if running <= cap:
        return ""
    host_ms = 1e3 * e.eager_launch_s * float(
        step_kernels(result.model, e, float(best.pp), float(best.ep)))
    return (f"note: the best layout decodes {running:.0f} requests a step, past the "
            f"{cap:.0f} that {e.name} replays as a CUDA graph: every decode step launches "
            f"its kernels eagerly, at least {host_ms:.1f} ms of host time a step; a larger "
            "graph batch (--cuda-graph-max-batch) holds more memory for graphs")


TPOT_LABELS = {"gemm": "GEMMs", "attention": "attention", "tp_allreduce": "TP all-reduce",
               "pipeline_send": "pipeline sends", "expert_dispatch": "expert dispatch",
               "small_kernels": "small kernels", "host_launch": "host launches",
               "engine_overhead": "engine host time", "prefill_forwards": "prompt forwards"}
"""How ``tpot_line`` names each of ``autoconfig.inference.latency.TPOT_PARTS``."""


TTFT_LABELS = {"waiting": "the steps under way", "prefill": "its prompt's steps",
               "queueing": "queueing behind other prompts",
               "first_decode": "the decode step that samples it"}
"""How ``ttft_line`` names each of ``autoconfig.inference.latency.TTFT_PARTS``."""


def _parts_line(result: InferenceSearchResult, metric: str, labels: dict) -> str:
    """What the best layout's ``metric`` (tpot or ttft) is made of, largest part
    first (its ``<metric>_<part>_ms`` columns), or '' where it is a simulated job's."""
    names = [f"{metric}_{name}_ms" for name in labels]
    if result.table.empty or not all(n in result.table for n in names):
        return ""
    best = result.table.iloc[0]
    parts = [(float(best[n]), label) for n, label in zip(names, labels.values())]
    if any(math.isnan(ms) for ms, _ in parts):
        return ""
    total = float(best[f"{metric}_ms"])
    shown = ", ".join(f"{label} {ms:.3g}" for ms, label in sorted(parts, reverse=True)
                      if ms >= 0.0005 * total)
    return f"{metric.upper()} of #1, {total:.4g} ms: {shown}"


def tpot_line(result: InferenceSearchResult) -> str:
    return _parts_line(result, "tpot", TPOT_LABELS)


def ttft_line(result: InferenceSearchResult) -> str:
    return _parts_line(result, "ttft", TTFT_LABELS)


def notes(result: InferenceSearchResult) -> list[str]:
    """The warnings printed under the table (load, CUDA graphs)."""
    return [line for line in (load_line(result), graph_line(result)) if line]


def _searched(result: InferenceSearchResult) -> bool:
    return result.job is not None and result.job.rate_search


def _job_text(job, limits, dispatch: str) -> str:
    arriving = f"Poisson, spread {dispatch} over replicas"
    how = ("sent all at once" if job.clients is None else f"sent by {job.clients} clients") \
        if job.rate_per_s is None else f"arriving at {job.rate_per_s:g}/s ({arriving})"
    if job.rate_search:
        how = (f"arriving ({arriving}) at the largest rate meeting the {limits.statistic} "
               "latency limits (rate/s, whole cluster; inf: sent at once they still meet them)")
    return f"{job.requests} requests {how}"


def _length(mean: int, std: float, dist: str = "gamma") -> str:
    law = " uniform" if dist == "uniform" else ""
    return f"{mean}" + (f" +/- {std:.0f}{law}" if std else "")


def headline(result: InferenceSearchResult) -> str:
    m, c, w = result.model, result.cluster, result.workload
    active = f", {format_count(active_params(m))} active" if m.is_moe else ""
    job = f", a job of {_job_text(result.job, result.limits, w.dispatch)}" \
        if result.job is not None else ""
    return (f"{m.name} ({format_count(total_params(m))} params{active}) inference on {c.nodes} x "
            f"{c.gpus_per_node} {c.gpu.name}, input {_length(w.input_len_tokens, w.input_len_std_tokens, w.length_dist)}, "
            f"output {_length(w.output_len_tokens, w.output_len_std_tokens, w.length_dist)} tokens{job}, "
            f"{w.precision}, objective {result.objective}"
            + (f", engine {result.engine.name} ({result.mode} batching)" if result.engine
               else ""))


def rejection_lines(result: InferenceSearchResult) -> list[str]:
    kept = len(result.table)
    lines = [f"considered {result.candidates} layouts: {kept} kept, "
             f"{result.candidates - kept} pruned"]
    return lines + [f"  {reason}: {count}" for reason, count in result.rejected.items()]


def render(result: InferenceSearchResult, top: int) -> str:
    lines = [line for line in (ttft_line(result), tpot_line(result), *notes(result)) if line]
    return "\n".join([headline(result), "",
                      tabulate(top_rows(result, top), headers=top_headers(result)), ""]
                     + ([*lines, ""] if lines else []) + rejection_lines(result))


def to_json(result: InferenceSearchResult, top: int | None = None) -> dict:
    table = result.table if top is None else result.table.head(top)
    return {"model": result.model.name, "gpu": result.cluster.gpu.name,
            "nodes": result.cluster.nodes, "gpus_per_node": result.cluster.gpus_per_node,
            "input_len_tokens": result.workload.input_len_tokens,
            "output_len_tokens": result.workload.output_len_tokens,
            "input_len_std_tokens": result.workload.input_len_std_tokens,
            "output_len_std_tokens": result.workload.output_len_std_tokens,
            "length_dist": result.workload.length_dist,
            "num_requests": result.job.requests if result.job is not None else None,
            "clients": result.job.clients if result.job is not None else None,
            "job_request_rate_per_s": result.job.rate_per_s if result.job is not None else None,
            "job_rate_searched": bool(result.job is not None and result.job.rate_search),
            "limits": {"max_ttft_ms": result.limits.max_ttft_ms,
                       "max_tpot_ms": result.limits.max_tpot_ms,
                       "max_latency_ms": result.limits.max_latency_ms,
                       "min_throughput_tokens_per_s": result.limits.min_throughput_tokens_per_s,
                       "statistic": result.limits.statistic},
            "precision": result.workload.precision, "objective": result.objective,
            "engine": result.engine.name if result.engine else None,
            "decode_steps": result.engine.decode_steps if result.engine else None,
            "mixed_prefill": result.engine.mixed_prefill if result.engine else None,
            "overlap_schedule": result.engine.overlap_schedule if result.engine else None,
            "prefill_samples_first_token": (result.engine.prefill_samples_first_token
                                            if result.engine else None),
            "max_batched_tokens": result.engine.max_batched_tokens if result.engine else None,
            "kv_cache_tokens": result.engine.kv_cache_tokens if result.engine else None,
            "cuda_graph_max_decode_seqs": (list(result.engine.graph_steps[:2])
                                           if result.engine and result.engine.graph_steps
                                           else None),
            "chunked_prefill": result.engine.chunked_prefill if result.engine else None,
            "kv_memory_fraction": (result.engine.kv_pool.share
                                   if result.engine and result.engine.kv_pool else None),
            "kv_policy": None if result.engine is None else result.engine.kv_policy,
            "fp8_context_fmha": (None if result.engine is None else fp8_prompt_attention(
                result.engine, result.workload.precision, result.cluster.gpu.generation)),
            "batching": result.mode,
            "candidates": result.candidates, "rejected": result.rejected,
            "plans": json.loads(table.to_json(orient="records"))}


def markdown(result: InferenceSearchResult, top: int) -> str:
    warnings = [line for line in (ttft_line(result), tpot_line(result), *notes(result))
                if line]
    front = result.table[result.table["pareto"]].sort_values("latency_ms")
    front_rows = [(r.tp, r.pp, r.batch, r.replicas, f"{r.latency_ms:.5g}",
                   f"{r.tokens_per_s_per_gpu:.4g}") for r in front.itertuples(index=False)]
    return "\n".join([
        f"# Inference search: {result.model.name}", "", headline(result), "",
        "## Top layouts", "",
        tabulate(top_rows(result, top), headers=top_headers(result), tablefmt="github"), "",
        *([*warnings, ""] if warnings else []),
        "## Pareto front (latency vs output tokens/s per GPU)", "",
        tabulate(front_rows, headers=("TP", "PP", "batch", "replicas", "latency ms",
                                      "tok/s/GPU"), tablefmt="github"), "",
        "## Pruned", "", *[f"- {line.strip()}" for line in rejection_lines(result)], "",
        "Predicted by autoconfig/inference/latency.py ("
        + ("continuous batching at steady state: 'batch' is the requests in flight per "
           "replica, each layout at the largest that meets the limits"
           if result.mode == "continuous" else
           "static batching: TTFT = prefill, latency = TTFT + (output - 1) x TPOT")
        + (f"; engine {result.engine.name}" if result.engine else "") + ").", ""])


def write_report(result: InferenceSearchResult, out_dir: Path, top: int,
                 plots: bool = True) -> dict:
    """Write the files; returns {kind: path}, plus 'plot_skipped' with the reason."""
    out_dir = Path(out_dir)
    files = {"csv": write_atomic(out_dir / CSV_NAME, result.table.to_csv(
                 index=False, float_format="%.6g", lineterminator="\n")),
             "markdown": write_atomic(out_dir / MARKDOWN_NAME, markdown(result, top)),
             "json": write_atomic(out_dir / JSON_NAME,
                                  json.dumps(to_json(result), indent=2) + "\n")}
    if plots:
        try:
            files["plot"] = plot_front(result, out_dir / PLOT_NAME)
        except Exception as exc:  # noqa: BLE001 - a plot never blocks the reports
            files["plot_skipped"] = f"{type(exc).__name__}: {exc}"
    return files


def plot_front(result: InferenceSearchResult, path: Path) -> Path:
    """Scatter of every kept layout and the Pareto front (matplotlib, Agg).

    Drawn for the seconds a search takes: a latency axis spanning more than a
    decade is logarithmic and labelled in plain milliseconds (its default
    ``10^n`` labels go through mathtext, 0.4 s), and the figure is laid out
    by fixed margins, not ``tight_layout``'s measuring pass (another 0.4 s)."""
    import textwrap

    from matplotlib.ticker import FuncFormatter, NullFormatter

    from autoconfig.figures import save, subplots

    table = result.table
    front = table[table["pareto"]].sort_values("latency_ms")
    fig, ax = subplots(figsize=(7, 4.5))
    ax.scatter(table["latency_ms"], table["tokens_per_s_per_gpu"], s=10, alpha=0.4,
               label="layouts")
    ax.plot(front["latency_ms"], front["tokens_per_s_per_gpu"], "o-", color="C3",
            label="Pareto front")
    for r in front.itertuples(index=False):
        ax.annotate(f"tp{r.tp} pp{r.pp} b{r.batch}", (r.latency_ms, r.tokens_per_s_per_gpu),
                    fontsize=7)
    latency = table["latency_ms"]
    if len(latency) and latency.max() > 10.0 * latency.min():
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda ms, _: f"{ms:,.0f}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("request latency (ms)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title("\n".join(textwrap.wrap(headline(result), 110)), fontsize=8)
    ax.legend()
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.12, top=0.88)
    return save(fig, path, dpi=120, tight=False)
