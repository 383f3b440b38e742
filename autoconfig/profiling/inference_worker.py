"""The inference profiling worker: real megatron-core static-batch inference of one plan.

Imports torch and megatron-core only inside functions (the CLI stays light).
One process per rank, started by the same submitit executors as training
profiling (``autoconfig.profiling.launch``):

- torch.distributed and model-parallel state (TP, PP) as the training worker
  sets them up (``autoconfig.profiling.worker``: gloo + the CPU bridge on CPU,
  NCCL on GPUs), and the same GPTModel build (layer spec, weights redrawn from
  the seed), without DDP or an optimizer; eval mode;
- megatron-core 0.16.1's static inference path:
  ``GPTInferenceWrapper(model, InferenceWrapperConfig(...), StaticInferenceContext(
  max_batch, max_seq))``, ``prep_model_for_inference``, ``prep_inference_input``,
  ``get_batch_for_context_window`` and ``run_one_forward_step`` (which pipelines
  the batch over PP stages in micro-batches when batch x tokens exceeds
  ``inference_batch_times_seqlen_threshold``), the KV cache living in the
  static context; ``enable_decode_mode`` after the prefill;
- one untimed generation, then a timed one: prefill (TTFT) and ``output - 1``
  decode steps (TPOT: their median), each step's time the slowest rank's.

Decode steps feed pre-drawn tokens instead of sampling the logits: the same
forward work per step, without a sampling broadcast.
"""

import contextlib
import json
import statistics
import time
import traceback
from dataclasses import asdict, dataclass, replace

from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Plan, Workload
from autoconfig.inference.plan import InferencePlan, InferenceWorkload

ERROR_TAIL_LINES = 20


@dataclass(frozen=True)
class InferenceProfileSpec:
    """One inference profiling run (on CPU: the scaled-down proxy model)."""

    model: ModelSpec
    workload: InferenceWorkload
    plan: InferencePlan
    device: str
    prefill_microbatches: int = 1
    seed: int = 1234
    master_addr: str = "127.0.0.1"
    master_port: int = 29500

    @property
    def world_size(self) -> int:
        return self.plan.gpus_per_replica

    def launch_plan(self) -> Plan:
        """The training Plan the shared launcher and results store key jobs by:
        one replica (dp 1), micro-batch = the request batch."""
        return Plan(tp=self.plan.tp, pp=self.plan.pp, dp=1, mbs=self.plan.batch)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "InferenceProfileSpec":
        data = json.loads(text)
        return cls(model=ModelSpec(**data.pop("model")),
                   workload=InferenceWorkload(**data.pop("workload")),
                   plan=InferencePlan(**data.pop("plan")), **data)


def inference_job(spec_json: str):
    """The submitit job function (every rank runs it); rank 0 returns a result dict."""
    from autoconfig.profiling.launch import _rendezvous, _watch_time_limit

    spec = InferenceProfileSpec.from_json(spec_json)
    spec = replace(spec, **_rendezvous(spec))
    _watch_time_limit()
    return run_task(spec)


def run_task(spec: InferenceProfileSpec) -> dict | None:
    from autoconfig.profiling.worker import _dist_env, _teardown

    rank, world_size, local_rank, addr, port = _dist_env(spec)
    result = None
    try:
        result = _run_rank(spec, world_size, rank, local_rank, addr, port)
    except Exception:  # noqa: BLE001 - any failure becomes a record
        status = "oom" if "OutOfMemoryError" in traceback.format_exc() else "error"
        result = {"status": status, "device": spec.device, "world_size": world_size,
                  "error": "\n".join(traceback.format_exc().strip().splitlines()
                                     [-ERROR_TAIL_LINES:])}
    finally:
        _teardown()
    if rank == 0 or result.get("status") != "ok":
        return result
    return None


def _run_rank(spec, world_size, rank, local_rank, addr, port) -> dict:
    import datetime

    import torch

    if spec.world_size != world_size:
        raise ValueError(f"plan needs {spec.world_size} ranks (tp*pp) but the job has {world_size}")
    if spec.device == "cuda":
        torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group(
        backend="nccl" if spec.device == "cuda" else "gloo", rank=rank, world_size=world_size,
        init_method=f"tcp://{addr}:{port}", timeout=datetime.timedelta(seconds=600))
    bridge = contextlib.nullcontext()
    if spec.device == "cpu":
        from autoconfig.profiling.cpu_bridge import cpu_bridge
        bridge = cpu_bridge()
    with bridge:
        return _generate_and_measure(spec, world_size)


def _training_spec(spec: InferenceProfileSpec):
    """The training worker's spec of the same shape, to reuse its model build."""
    from autoconfig.profiling.spec import ProfileSpec

    workload = Workload(global_batch_size=spec.plan.batch,
                        seq_len=spec.workload.total_len_tokens)
    return ProfileSpec(model=spec.model, workload=workload, plan=spec.launch_plan(),
                       device=spec.device, seed=spec.seed)


def _build_model(spec: InferenceProfileSpec):
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from autoconfig.profiling import worker as train_worker

    tspec = _training_spec(spec)
    tspec = replace(tspec, model=train_worker.model_as_run(tspec))
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=spec.plan.tp,
                                             pipeline_model_parallel_size=spec.plan.pp)
    torch.manual_seed(spec.seed)
    model_parallel_cuda_manual_seed(spec.seed)
    config = train_worker._transformer_config(tspec)
    if tspec.model.is_moe:
        train_worker._define_missing_te_gemm()
    block = train_worker._block_spec(tspec, config, None)
    model = GPTModel(config=config, transformer_layer_spec=block,
                     vocab_size=train_worker._padded_vocab(tspec),
                     max_sequence_length=spec.workload.total_len_tokens,
                     pre_process=parallel_state.is_pipeline_first_stage(),
                     post_process=parallel_state.is_pipeline_last_stage(),
                     share_embeddings_and_output_weights=spec.model.tied_embeddings,
                     position_embedding_type="rope" if spec.model.position_embedding == "rope"
                     else "learned_absolute")
    if spec.device == "cuda":
        model.cuda(torch.cuda.current_device())
        model = model.to(torch.bfloat16)
    train_worker._redraw_weights(tspec, config, model, None)
    return model, config, train_worker._padded_vocab(tspec)


def static_wrapper(spec: InferenceProfileSpec, model, config, vocab: int, threshold: int = -1):
    """(GPTInferenceWrapper, StaticInferenceContext) of megatron-core's static path for
    ``spec``'s batch and total length; ``threshold``: batch x tokens past which a
    prefill is split into request micro-batches (-1: never)."""
    from megatron.core.inference.contexts import StaticInferenceContext
    from megatron.core.inference.model_inference_wrappers.gpt.gpt_inference_wrapper import (
        GPTInferenceWrapper)
    from megatron.core.inference.model_inference_wrappers.inference_wrapper_config import (
        InferenceWrapperConfig)

    batch, total = spec.plan.batch, spec.workload.total_len_tokens
    context = StaticInferenceContext(batch, total)
    wrapper = GPTInferenceWrapper(model, InferenceWrapperConfig(
        hidden_size=spec.model.hidden_size, params_dtype=config.params_dtype,
        inference_batch_times_seqlen_threshold=threshold, padded_vocab_size=vocab,
        inference_max_requests=batch, inference_max_seq_length=total), context)
    return wrapper, context


def _generate_and_measure(spec: InferenceProfileSpec, world_size: int) -> dict:
    import torch

    from autoconfig.profiling.worker import peak_memory_bytes

    model, config, vocab = _build_model(spec)
    batch, s_in = spec.plan.batch, spec.workload.input_len_tokens
    total = spec.workload.total_len_tokens
    # Megatron splits a prefill of batch x s_in tokens into micro-batches of
    # threshold // s_in requests: ask for the predicted number of micro-batches.
    per_microbatch = max(1, batch // max(1, spec.prefill_microbatches))
    threshold = per_microbatch * s_in if spec.prefill_microbatches > 1 else -1
    wrapper, context = static_wrapper(spec, model, config, vocab, threshold)
    device = torch.device("cuda", torch.cuda.current_device()) if spec.device == "cuda" \
        else torch.device("cpu")
    generator = torch.Generator().manual_seed(spec.seed)
    tokens = torch.randint(0, spec.model.vocab_size, (batch, total), generator=generator)
    tokens = tokens.to(device)
    _generate(spec, wrapper, context, tokens)                 # warm-up, untimed
    times = _generate(spec, wrapper, context, tokens)
    reduced = torch.tensor(times, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(reduced, op=torch.distributed.ReduceOp.MAX)
    times = [float(t) for t in reduced.tolist()]
    ttft, steps = times[0], times[1:]
    tpot = statistics.median(steps) if steps else 0.0
    latency = sum(times)
    return {"status": "ok", "device": spec.device, "world_size": world_size,
            "measured_ttft_ms": ttft * 1e3, "measured_tpot_ms": tpot * 1e3,
            "measured_latency_ms": latency * 1e3,
            "measured_tokens_per_s_per_replica": batch * spec.workload.output_len_tokens / latency,
            "step_times_s": times, "peak_memory_bytes": peak_memory_bytes(spec),
            "model_name": spec.model.name, "batch": batch, "error": ""}


def _generate(spec, wrapper, context, tokens) -> list[float]:
    """Prefill then decode steps; seconds of each (this rank)."""
    import torch

    s_in, total = spec.workload.input_len_tokens, spec.workload.total_len_tokens
    wrapper.prep_model_for_inference()
    inputs = wrapper.prep_inference_input(tokens)
    times = []
    start_position = 0
    for end in range(s_in, total):
        window = wrapper.get_batch_for_context_window(inputs, start_position, end)
        _synchronize(spec)
        torch.distributed.barrier()
        start = time.perf_counter()
        with torch.inference_mode():
            wrapper.run_one_forward_step(window)
        _synchronize(spec)
        times.append(time.perf_counter() - start)
        if start_position == 0:
            context.enable_decode_mode()
        start_position = end
    return times


def _synchronize(spec) -> None:
    import torch

    if spec.device == "cuda":
        torch.cuda.synchronize()


def main() -> int:
    """``python -m autoconfig.profiling.inference_worker SPEC_JSON``: one rank (torchrun-style env)."""
    import sys

    result = run_task(InferenceProfileSpec.from_json(sys.argv[1]))
    if result is not None:
        print(json.dumps(result))
    return 0 if result is None or result.get("status") == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
