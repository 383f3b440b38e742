"""``autoconfig infer`` and ``autoconfig infer-validate``: serving layouts of a model.

Thin: parse the options, one library call (``autoconfig.inference.search.search``,
then ``autoconfig.profiling.inference_sweep.run`` with --profile), render and write.
"""

import json
import sys
from pathlib import Path

import click

from autoconfig.cli.options import (OUTPUT_DIR, IntListOrAuto, RateOrMax,
                                    model_options)
from autoconfig.core import catalog
from autoconfig.core.catalog import resolve_model
from autoconfig.core.hardware import Cluster, cluster_from_gpus
from autoconfig.core.plan import SERVING_PRECISIONS
from autoconfig.errors import InputError
from autoconfig.inference import datasets
from autoconfig.inference import engine as engines
from autoconfig.inference.dispatch import DEFAULT_DISPATCH, DISPATCHES, check_dispatch_used
from autoconfig.inference.latency import MODES
from autoconfig.inference.lengths import LENGTH_DISTS, check_length_law
from autoconfig.inference.search import DEFAULT_MAX_BATCH, OBJECTIVES, STATISTICS
from autoconfig.profiling import executors
from autoconfig.profiling.spec import DEVICES
from autoconfig.profiling.store import RETRY_CHOICES
from autoconfig.training.inputs import DEFAULT_GPU, gpus_per_node_for

DEFAULT_TOP = 10


def _cluster(gpu_name: str | None, gpus: int | None, nodes: int | None,
             gpus_per_node: int | None) -> Cluster:
    gpu = catalog.get_gpu(gpu_name or DEFAULT_GPU)
    per_node = gpus_per_node_for(gpu, gpus_per_node)
    if (gpus is None) == (nodes is None):
        raise InputError("give the cluster size as either --gpus N or --nodes N")
    if nodes is not None:
        if nodes < 1:
            raise InputError(f"invalid --nodes {nodes}: must be at least 1")
        return Cluster(gpu=gpu, nodes=nodes, gpus_per_node=per_node)
    return cluster_from_gpus(gpu, gpus, per_node)


@click.command()
@model_options
@click.option("--gpu", help=f"GPU type (default {DEFAULT_GPU}).")
@click.option("--gpus", type=int, help="Number of GPUs (or give --nodes).")
@click.option("--nodes", type=int, help="Number of nodes (or give --gpus).")
@click.option("--gpus-per-node", type=int, help="GPUs per node (default: the GPU's usual node).")
@click.option("--input-len", type=int, help="Prompt tokens per request (the mean when they "
              "spread).")
@click.option("--output-len", type=int, help="Generated tokens per request (the mean when they "
              "spread).")
@click.option("--input-len-std", type=float, default=None,
              help="Spread (standard deviation) of the prompt lengths in tokens (default 0: "
                   "all the same, or the --dataset's).")
@click.option("--output-len-std", type=float, default=None,
              help="Spread of the output lengths in tokens (default 0, or the --dataset's).")
@click.option("--length-dist", type=click.Choice(LENGTH_DISTS), default=None,
              help="Law of spread lengths in a --num-requests job: gamma (a conversation "
                   "dataset's long tail, ShareGPT-like) or uniform (evenly over mean +/- "
                   "1.73 x spread: vLLM's and SGLang's 'random' dataset with a range ratio). "
                   "Needs a spread (--*-len-std or a --dataset's) [default: gamma].")
@click.option("--dataset", "dataset_name", type=click.Choice(datasets.names()), default=None,
              help="Take the length means and spreads of a benchmark dataset "
                   "(heuristics/datasets.yaml); --input-len/--output-len and their --*-std "
                   "override it.")
@click.option("--num-requests", type=int, default=None,
              help="Predict a finite job of this many requests on an in-flight engine: all "
                   "sent at once (offline), by --concurrency clients that each send the next "
                   "when one finishes, or at --request-rate (Poisson arrivals, as vLLM's and "
                   "SGLang's serving benchmarks send them); scored on its means and its "
                   "duration, the drain and the queueing included.")
@click.option("--max-ttft-ms", type=float, help="Limit on time to first token.")
@click.option("--max-tpot-ms", type=float, help="Limit on time per output token.")
@click.option("--max-latency-ms", type=float, help="Limit on request latency.")
@click.option("--min-throughput", type=float,
              help="Least output tokens/s of the whole cluster.")
@click.option("--precision", type=click.Choice(SERVING_PRECISIONS), default="bf16",
              show_default=True,
              help="Weights and KV cache in bf16 or fp8; nvfp4: FP4 weights and activations "
                   "(Blackwell) with an FP8 KV cache.")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="throughput",
              show_default=True, help="Rank by cluster tokens/s, request latency, or tokens/s "
              "per GPU (cost).")
@click.option("--engine", "engine_name", type=click.Choice(engines.names()),
              default=engines.DEFAULT_ENGINE, show_default=True,
              help="Serving engine (heuristics/engines/*.yaml): its batching, KV cache, "
                   "all-reduce and per-step costs.")
@click.option("--decode-steps", type=int, default=None,
              help="In-flight engines: decode steps run per scheduler call (vLLM "
                   "--num-scheduler-steps, SGLang --num-continuous-decode-steps; default the "
                   "engine's, 1): the scheduler's host time is paid once per run, and new "
                   "requests wait for the run to end.")
@click.option("--mixed-prefill/--no-mixed-prefill", "mixed_prefill", default=None,
              help="In-flight engines: a step that prefills also decodes the running "
                   "requests (vLLM V1, TensorRT-LLM), or prefill runs alone and the decodes "
                   "wait (SGLang without --enable-mixed-chunk, vLLM V0); default the "
                   "engine's.")
@click.option("--overlap-schedule/--no-overlap-schedule", "overlap_schedule", default=None,
              help="In-flight engines: the scheduler builds each step while the one before "
                   "runs (SGLang, TensorRT-LLM's PyTorch backend; vLLM --async-scheduling), "
                   "so a new request waits a step longer for its first token; default the "
                   "engine's.")
@click.option("--gemm-allreduce-fusion/--no-gemm-allreduce-fusion", "gemm_allreduce_fusion",
              default=None,
              help="TensorRT-LLM: run each row-parallel GEMM fused with its tensor-parallel "
                   "all-reduce (trtllm-build --gemm_allreduce_plugin), which then hides under "
                   "the GEMM inside one NVLink domain on Hopper and Blackwell; default off.")
@click.option("--fp8-context-fmha/--no-fp8-context-fmha", "fp8_context_fmha", default=None,
              help="TensorRT-LLM with --precision fp8 or nvfp4: run the prompts' attention "
                   "(context FMHA) on FP8 tensor cores (trtllm-build --use_fp8_context_fmha, "
                   "as trtllm-bench builds FP8 engines), on Hopper and Blackwell; default on.")
@click.option("--cuda-graph-max-batch", type=int, default=None,
              help="In-flight engines that capture decode steps as CUDA graphs up to a batch "
                   "(SGLang --cuda-graph-max-bs): larger decode batches, and prefills, launch "
                   "every kernel eagerly and pay its host time; default the engine's (SGLang "
                   "0.5: 256, 512 from TP 4; 0.3-0.4: 160).")
@click.option("--max-batched-tokens", type=int, default=None,
              help="In-flight engines: tokens one step may process, prompt chunks and decodes "
                   "(vLLM --max-num-batched-tokens, TensorRT-LLM max_num_tokens, SGLang "
                   "--chunked-prefill-size); default the engine's.")
@click.option("--kv-cache-tokens", type=int, default=None,
              help="Paged engines: the KV pool of one replica in tokens, as set on the engine "
                   "(vLLM --num-gpu-blocks-override x block size, SGLang --max-total-tokens, "
                   "TensorRT-LLM KvCacheConfig max_tokens, LMDeploy cache_max_entry_count "
                   "blocks x 128); a layout whose memory cannot hold it does not fit; default: "
                   "the engine's memory share (--kv-memory-fraction), else what memory leaves.")
@click.option("--kv-memory-fraction", type=float, default=None,
              help="Paged engines that size their KV pool from a memory share: TensorRT-LLM "
                   "free_gpu_memory_fraction (of the memory free once the model is loaded, "
                   "default 0.9), vLLM --gpu-memory-utilization (of the whole GPU, 0.9), "
                   "SGLang --mem-fraction-static (weights and pool, of the whole GPU; default "
                   "derived from its reserve); default the engine's.")
@click.option("--chunked-prefill/--no-chunked-prefill", "chunked_prefill", default=None,
              help="In-flight engines: prompts are split to fill each step's token budget "
                   "(TensorRT-LLM enable_chunked_context, vLLM --enable-chunked-prefill) or "
                   "run whole; default the engine's.")
@click.option("--kv-policy", type=click.Choice(engines.KV_POLICIES), default=None,
              help="In-flight engines: reserve admits a request only when the KV cache holds "
                   "its prompt and whole output (TensorRT-LLM GUARANTEED_NO_EVICT); preempt "
                   "admits against the prompt and evicts the newest request, recomputed "
                   "later, when the cache fills (vLLM, TensorRT-LLM MAX_UTILIZATION); "
                   "estimate admits against the prompt and a decaying share of the outputs "
                   "to come (SGLang's default); exact only when every admitted request can "
                   "still finish without an eviction (SGLang serving requests sent with "
                   "ignore_eos, its benchmark's default, with --disable-radix-cache); "
                   "default the engine's.")
@click.option("--batching", type=click.Choice(MODES), default=None,
              help="static: each batch served together start to end; continuous: requests "
                   "join and leave every step, steady state at a concurrency (default: the "
                   "engine's batching; static when --batch is given).")
@click.option("--batch", type=IntListOrAuto, default=None,
              help="Static batch sizes to try, any integers, e.g. 12 or 1,12,48 (default: "
                   "powers of two up to --max-batch).")
@click.option("--concurrency", type=IntListOrAuto, default=None,
              help="Continuous batching: requests in flight per replica to predict, e.g. "
                   "32,64 (default: the largest meeting the limits); with --num-requests, "
                   "the job's clients.")
@click.option("--request-rate", type=RateOrMax(), default=None,
              help="Continuous batching: requests/s the whole cluster must serve; each layout "
                   "at the concurrency that rate brings (Little's law). With --num-requests: "
                   "the job's arrival rate; max: the largest rate at which the job meets the "
                   "latency limits (MLPerf Server's question), searched per layout, its "
                   "latencies over the requests that arrive once the server has filled and "
                   "before it drains, as a long-running server sees them.")
@click.option("--dispatch", type=click.Choice(DISPATCHES), default=None,
              help="With --request-rate: how the router in front of the replicas spreads "
                   "the arrivals: round-robin (each replica every k-th request; also the "
                   "model of a least-loaded router) or random (a Kubernetes Service), whose "
                   "bursts lengthen TTFT and TPOT [default: round-robin].")
@click.option("--limit-statistic", type=click.Choice(STATISTICS), default="mean",
              show_default=True,
              help="What --max-ttft-ms/--max-tpot-ms/--max-latency-ms bound: the mean over "
                   "requests, or with --num-requests their median (p50) or 99th percentile "
                   "(p99, as MLPerf's Server constraints and most serving SLAs).")
@click.option("--disaggregated", is_flag=True,
              help="Also rank serving with prefill and decode on separate GPU pools (the KV "
                   "cache moved between them), as rows beside aggregated serving.")
@click.option("--tp", type=IntListOrAuto, default=None,
              help="Tensor-parallel sizes to try, e.g. 8 or 8,16 (default auto; TP across "
                   "nodes where the engine runs it).")
@click.option("--pp", type=IntListOrAuto, default=None,
              help="Pipeline-parallel sizes (default auto: divisors of the layers, and the "
                   "powers of two where the engine deals layers unevenly: pipeline_layers "
                   "in its file).")
@click.option("--ep", type=IntListOrAuto, default=None,
              help="Expert-parallel sizes of MoE models (default auto: 1 and each multiple "
                   "of TP that divides the experts and a stage's GPUs); 1 keeps every expert "
                   "on each replica's GPUs.")
@click.option("--max-batch", type=int, default=None,
              help=f"Largest static batch tried (powers of two up to it; default "
                   f"{DEFAULT_MAX_BATCH}) or concurrency tried (default: the engine's own "
                   "sequence cap).")
@click.option("--top", type=int, default=DEFAULT_TOP, show_default=True, help="Layouts to print.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True)
@click.option("--plots/--no-plots", default=True, show_default=True,
              help="Write the Pareto front PNG (needs matplotlib).")
@click.option("-o", "--output-dir", type=OUTPUT_DIR,
              help="Report folder (default ./autoconfig-out/<model>-<gpu>-infer).")
@click.option("--profile", is_flag=True,
              help="Prove it: run megatron-core static inference for the top layouts and rank "
                   "them by measured latency.")
@click.option("--device", type=click.Choice(DEVICES), default="cuda", show_default=True,
              help="cpu runs a scaled-down proxy of the model (not GPU figures).")
@click.option("--executor", type=click.Choice(executors.names()), default="local",
              show_default=True)
@click.option("--top-k", type=int, default=3, show_default=True, help="Layouts to profile.")
@click.option("--max-minutes", type=int, default=10, show_default=True,
              help="Time limit of each profiling job.")
@click.option("--max-parallel", type=int, default=1, show_default=True,
              help="Profiling jobs running at once.")
@click.option("--partition", help="SLURM partition.")
@click.option("--account", help="SLURM account.")
@click.option("--dry-run", is_flag=True, help="With --profile: print the jobs, run nothing.")
@click.option("--calibration", type=click.Path(dir_okay=False),
              help="Calibration file from `autoconfig calibrate` (GEMM, traffic and link "
                   "constants refitted on this GPU's measurements).")
@click.option("--retry", multiple=True, type=click.Choice(RETRY_CHOICES),
              help="With --profile: run again layouts whose final record has this status "
                   "(repeatable; failed: every status but ok).")
def infer(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu, gpu, gpus, nodes,
          gpus_per_node, input_len, output_len, input_len_std, output_len_std, length_dist,
          dataset_name,
          num_requests, max_ttft_ms, max_tpot_ms, max_latency_ms,
          min_throughput, precision, objective, engine_name, decode_steps, mixed_prefill,
          overlap_schedule, gemm_allreduce_fusion, fp8_context_fmha, cuda_graph_max_batch,
          max_batched_tokens, kv_cache_tokens, kv_memory_fraction, chunked_prefill, kv_policy,
          batching, batch, concurrency,
          request_rate, dispatch, limit_statistic, disaggregated, tp,
          pp, ep, max_batch, top, fmt, plots, output_dir,
          profile, device, executor, top_k, max_minutes, max_parallel, partition, account,
          dry_run, calibration, retry) -> None:
    """Rank inference layouts (TP, PP, batch, replicas) by predicted throughput or
    latency: TTFT, TPOT, request latency, tokens/s and requests/s per GPU, per
    replica and in total, memory per GPU, and the throughput-latency Pareto front.
    Writes infer.csv, infer.md, infer.json and infer_pareto.png."""
    from autoconfig.inference import report
    from autoconfig.inference.plan import InferenceWorkload
    from autoconfig.inference.job import Job
    from autoconfig.inference.search import Limits, Pins, search

    lengths = _lengths(dataset_name, input_len, output_len, input_len_std, output_len_std)
    input_len, output_len = lengths[0], lengths[1]
    spec = resolve_model(model, size, layers, hidden, heads, kv_heads, ffn, vocab, swiglu,
                         input_len + output_len)
    if spec is None:
        raise InputError("no model: give --model (and --size) or an inline shape "
                         "(--layers --hidden --heads --vocab)")
    if spec.is_encoder_decoder:
        # The latency and KV-cache model describes decoder-only serving; an
        # encoder pass per request and a cross-attention cache per decoder
        # layer are not in it, so any answer would be a GPT's.
        raise InputError(f"infer does not model encoder-decoder models ({spec.name}): the "
                         "encoder pass and the decoder's cross-attention KV cache are not in "
                         "its latency or memory model; train-side commands (search, estimate, "
                         "capacity, sweep) support them")
    if top < 1:
        raise InputError(f"invalid --top {top}: must be at least 1")
    cluster = _cluster(gpu, gpus, nodes, gpus_per_node)
    check_length_law(length_dist, *lengths[2:], num_requests is not None)
    check_dispatch_used(dispatch, request_rate is not None)
    workload = InferenceWorkload(input_len, output_len, precision, *lengths[2:],
                                 length_dist or LENGTH_DISTS[0], dispatch or DEFAULT_DISPATCH)
    limits = Limits(max_ttft_ms, max_tpot_ms, max_latency_ms, min_throughput, limit_statistic)
    engine = engines.configured(engine_name, decode_steps, mixed_prefill, chunked_prefill,
                                max_batched_tokens, kv_cache_tokens, kv_policy,
                                kv_memory_fraction, overlap_schedule, cuda_graph_max_batch,
                                gemm_allreduce_fusion, fp8_context_fmha)
    engines.check_precision(engine, precision)
    if engine.decode_steps > 1 and (batching == "static" or batch):
        raise InputError(f"invalid --decode-steps {engine.decode_steps}: multi-step decoding "
                         "is a scheduler setting of continuous batching, not of static batches "
                         "(--batch, --batching static)")
    if batch and concurrency:
        raise InputError("give either --batch (static batches) or --concurrency (continuous "
                         "batching), not both")
    if max_batch is not None and (batch or concurrency) and num_requests is None:
        raise InputError("--max-batch bounds the batches or concurrencies searched: with "
                         "--batch or --concurrency given there is none to search (drop one)")
    if concurrency and batching == "static":
        raise InputError("--concurrency needs --batching continuous (static batches take "
                         "--batch)")
    if request_rate == "max" and num_requests is None:
        raise InputError("--request-rate max searches the rate of a job: give --num-requests "
                         "(and the latency limits it must meet)")
    mode = batching or ("continuous" if concurrency or request_rate or num_requests else None)
    job = None
    if num_requests is not None:
        if concurrency and len(concurrency) > 1:
            raise InputError("--num-requests takes one --concurrency (its clients), not a list")
        searched = request_rate == "max"
        job = Job(num_requests, concurrency[0] if concurrency else None,
                  None if searched else request_rate, searched)
        concurrency = request_rate = None
    pins = Pins(tp=tuple(tp or ()), pp=tuple(pp or ()), batch=tuple(batch or concurrency or ()),
                ep=tuple(ep or ()))
    options = None
    if profile:
        from autoconfig.profiling.inference_sweep import InferProfileOptions, check
        options = InferProfileOptions(device=device, executor=executor, top_k=top_k,
                                      max_minutes=max_minutes, max_parallel=max_parallel,
                                      partition=partition, account=account, dry_run=dry_run,
                                      retry=tuple(retry))
        check(options)
    from autoconfig.profiling.calibrate import constants_for
    constants, note = constants_for(calibration, cluster.gpu.name)
    result = search(spec, workload, cluster, objective, limits, max_batch, constants, engine,
                    mode, pins, request_rate, disaggregated, job)
    if fmt != "json":
        click.echo(report.engine_line(result, engine_name == engines.DEFAULT_ENGINE), err=True)
    if note:
        click.echo(note, err=True)
    out = Path(output_dir) if output_dir else (
        Path("autoconfig-out") / f"{spec.name}-{cluster.gpu.name}-infer")
    files = report.write_report(result, out, top, plots=plots)
    if fmt == "json":
        click.echo(json.dumps(report.to_json(result, top), indent=2))
    else:
        click.echo(report.render(result, top))
        click.echo("\nwrote:\n" + "\n".join(f"  {v}" for k, v in files.items()
                                           if k != "plot_skipped"))
    if fmt != "json":
        _echo_published(result)
    if "plot_skipped" in files:
        click.echo(f"note: Pareto plot skipped ({files['plot_skipped']})", err=True)
    if options is not None:
        from autoconfig.profiling.inference_sweep import render as render_profile, run

        table = run(result, options, out, echo=lambda text: click.echo(text, err=True))
        if table is not None:
            click.echo("\n" + render_profile(table, device,
                                              result.engine.name if result.engine else ""))


def _lengths(dataset_name, input_len, output_len, input_std, output_std) -> tuple:
    """(input mean, output mean, input spread, output spread): the flags, else the dataset's."""
    data = datasets.get_dataset(dataset_name) if dataset_name else None
    if data is None and (input_len is None or output_len is None):
        raise InputError("give --input-len and --output-len, or --dataset "
                         f"({', '.join(datasets.names())})")

    def pick(flag, name, whole):
        if flag is not None:
            return flag
        value = getattr(data, name) if data is not None else 0.0
        return max(1, round(value)) if whole else value
    return (pick(input_len, "input_len_tokens", True), pick(output_len, "output_len_tokens", True),
            pick(input_std, "input_len_std_tokens", False),
            pick(output_std, "output_len_std_tokens", False))


def _echo_published(result) -> None:
    """Published measurements of this exact setting, each with its prediction error."""
    from autoconfig.inference.published import matching_points, point_rows

    points = matching_points(result.model.name, result.cluster.gpu.name, result.workload)
    if not points.empty:
        click.echo("\npublished measurements of this setting (each on its own replica; "
                   "`autoconfig infer-validate` checks the orderings):\n" + point_rows(points))


@click.command("infer-validate")
@click.option("--points", "points_path", type=click.Path(path_type=Path), default=None,
              help="CSV of published inference points (default: the shipped "
                   "benchmarks/published_inference.csv).")
@click.option("--check", is_flag=True, help="Exit 1 when a target is missed (for CI).")
def infer_validate(points_path: Path | None, check: bool) -> None:
    """Predict every published inference point and print the error of each,
    whether the predicted orderings by throughput match, and which targets are met."""
    from autoconfig.inference.published import format_report, validate
    from autoconfig.validation.scoring import format_targets
    from autoconfig.validation.serving_targets import serving_targets

    result = validate(points_path)
    targets = serving_targets(result)
    click.echo("\n".join([format_report(result), "", *format_targets(targets)]))
    if check and not all(met for *_, met in targets):
        click.echo("error: inference validation targets missed (see Targets above)", err=True)
        sys.exit(1)
