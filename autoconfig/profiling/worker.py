"""The profiling worker: real megatron-core training steps of one plan, measured.

The only module of autoconfig that imports torch and megatron-core, and only
inside functions, so the CLI stays light. One process per rank:

- torch.distributed from submitit's JobEnvironment or torchrun-style variables
  (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT); NCCL on GPUs, gloo on CPU;
- megatron-core model-parallel state (TP, PP, VP, CP; DP is what is left);
- one megatron-core GPTModel per virtual stage, dropout 0; on CPU the local
  layer spec in fp32 with fusions off and the CUDA assumptions bridged
  (cpu_bridge.py); on GPU bf16 (config.bf16 + Float16Module) with the
  TransformerEngine spec when TE is installed, else the local spec;
- megatron DDP + get_megatron_optimizer (Adam), distributed optimizer per plan;
- warm-up then timed iterations of get_forward_backward_func() + optimizer.step().

Weights are re-drawn after construction from (seed, global parameter name) on
the full unsharded shape and then sharded, so every layout of the same model
starts from the same weights and the first losses of plans agree.

Mixture-of-experts models: the layer pattern (leading dense layers, then every
n-th layer MoE) becomes megatron-core's ``moe_layer_freq`` list; routed experts,
top-k, expert FFN and shared experts from the ModelSpec; EP and ETP go to
``initialize_model_parallel``; dropless routing, aux-loss coefficient 0 and
no fusions (Megatron-LM's defaults). On GPUs the stack's token dispatcher and
grouped GEMM run as asked; on CPU see below. The record says which dispatcher
ran (``moe_dispatcher``) and what the run changed (``run_notes``).

MoE on CPU with gloo: what was run and found (torch 2.13.0 CPU, megatron-core
0.16.1, checked 2026-11-24; the tiny-moe model, 4 layers with 1 leading dense, 8
experts top-2, SequentialMLP experts; 4 CPU processes; forward and backward
and Adam steps, 1 warm-up + 2 timed):

- Both dispatchers need one fix that is not about CPU: megatron-core 0.16.1's
  router reads ``te_general_gemm``, defined only when TransformerEngine
  imports, so without TE every MoE forward raised "NameError: name
  'te_general_gemm' is not defined" (moe_utils.py RouterGatingLinearFunction;
  also on GPUs without TE). ``_define_missing_te_gemm`` defines it as None.
- ``allgather``: then ran as is. OK with EP 2 and 4 at TP 1 (DP 4), EP 2 and
  4 at TP 2 + SP (DP 2), EP 2 with ETP 2, PP 2 with EP 2 and full recompute,
  selective recompute; also EP 2 on 2 processes.
- ``alltoall``: failed on CPU three ways, each bridged in cpu_bridge.py (5-7):
  (1) its constructor makes a CUDA stream for device-to-host copies:
  "RuntimeError: torch.cuda.Stream requires CUDA support when instantiating
  MoELayer"; (2) with that bridged, its split sizes stay tensors (its helper
  converts only CUDA tensors to numpy) and gloo refused them: "TypeError:
  all_to_all_single(): incompatible function arguments"; (3) with ETP 2 it
  gathers unequal token counts over the expert-TP group, which gloo refuses:
  "RuntimeError: ProcessGroupGloo::allgather: invalid tensor size at index 1
  (expected (139, 64), got (137, 64))". Bridged, it ran every configuration
  allgather ran, plus the distributed optimizer with EP 4.
- ``flex`` (DeepEP, HybridEP): CUDA-only kernels; "ImportError: DeepEP is not
  installed" / "HybridEP is not installed" when the MoE layer is built. On
  CPU the worker runs ``alltoall`` instead and notes it in the record.
- Losses: with the same seed and data every EP/ETP/TP/SP/PP layout and both
  dispatchers gave the same losses to ~1e-7 (6.947952, 6.855896, 6.776492).
- MoE with TP > 1 and no sequence parallelism: megatron-core itself refuses it
  in the forward ("ValueError: During training, performance may degrade if
  MoE and tensor parallelism are enabled without also enabling sequence
  parallelism"), on any device; the plan search never proposes it.
- Grouped GEMM needs TransformerEngine (CUDA): on CPU the experts run one after
  another (SequentialMLP); a stack asking for it gets a note.
- Multi-latent attention does not run on CPU: megatron-core's local spec gives
  MLASelfAttention the local DotProductAttention, which does not take MLA's
  key/value widths ("TypeError: DotProductAttention.__init__() got an
  unexpected keyword argument 'k_channels' when instantiating
  DotProductAttention when instantiating MLASelfAttention"); it needs
  TransformerEngine's attention. On CPU (and on GPUs without TE) an MLA model
  runs grouped-query attention with the same heads, and the record says so.
- Multi-token-prediction modules are not built (noted in the record).

Encoder-decoder models (T5, mT5): one megatron-core ``T5Model`` per rank, an
encoder config with the encoder's layers and a decoder config with the
decoder's (both from the same plan, as Megatron-LM's pretrain_t5.py builds
them, so ``recompute_num_layers`` applies to each stack); GeGLU/ReGLU/SwiGLU
as a gated MLP with GELU/ReLU/SiLU. Synthetic batches hold encoder tokens
[b, seq_len], decoder tokens and labels [b, decoder_seq_len], a loss mask
and the encoder, decoder and encoder-decoder attention masks megatron-core's
T5 dataset makes (``T5MaskedWordPieceDataset.config_attention_mask``: [b, 1,
q, k] masks for the local spec, padding masks for TransformerEngine's).
Tokens per second count encoder tokens (samples x seq_len), as NeMo counts
T5's; the loss is the mean over decoder tokens. megatron-core 0.16 runs T5
with pp 1 only ("Pipeline parallelism is not supported for T5") and has no
context-parallel or expert path for it: such a plan gets a one-line failed
record before any rank starts (``encoder_decoder_refusal``). On CPU (torch
2.13.0, megatron-core 0.16.1, tiny-t5, checked 2026-11-24) TP 2 with and
without SP, DP 2 with the distributed optimizer, micro-batch 2 with gradient
accumulation, full (uniform, block) and selective recompute ran as they are,
with the same losses (the same function, as for GPT). A relative position
bias does not run without TransformerEngine: megatron-core's local
DotProductAttention raises "Attention bias is not supported for
DotProductAttention."; there the run uses learned absolute positions and the
record says so.
"""

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import statistics
import sys
import time
import traceback
import zlib
from pathlib import Path

from autoconfig.core.model import model_flops_per_token
from autoconfig.launch.megatron_lm import SKIP_WINDOW_EVERY, window_size
from autoconfig.launch.sbatch import ALLOCATOR_ENV
from autoconfig.profiling.spec import ProfileResult, ProfileSpec

ERROR_TAIL_LINES = 20
PROCESS_GROUP_TIMEOUT_S = 600
"""A collective that waits this long means a peer died: fail rather than hang."""
VOCAB_PAD_MULTIPLE = 128
"""Megatron-LM pads the vocabulary to a multiple of 128 * tp (--make-vocab-size-divisible-by)."""
INIT_METHOD_STD = 0.02
ADAM_LR = 1e-3
CPU_MOE_DISPATCHERS = ("alltoall", "allgather")
"""MoE token dispatchers that run on CPU with gloo (module doc); the first is the fallback."""
CPU_RUNS_MLA = False
"""megatron-core's multi-latent attention needs TransformerEngine's attention (module doc):
on CPU an MLA model's proxy runs grouped-query attention, and its record says so."""
RELATIVE_BIAS_NOTE = ("relative position bias needs TransformerEngine's attention (megatron-core's "
                      "local DotProductAttention refuses an attention bias): ran learned "
                      "absolute positions")
"""What a T5 run with a relative position bias changes where TE is missing (CPU included)."""
LOCAL_LAYERS_NOTE = ("no TransformerEngine on this GPU: megatron-core's local layers ran (PyTorch "
                     "norms and rotary embedding, attention probabilities kept in fp32 and bf16), "
                     "which keep more activations and launch more kernels than the TE layers "
                     "the prediction prices")
"""Why a GPU run without TE measures above its prediction: on an H200 a Qwen3-like MoE
layer kept 2.1x the activation bytes of the TE layer (benchmarks/gpu/README.md)."""
MCORE_DISPATCHERS = {"allgather": ("allgather", None), "alltoall": ("alltoall", None),
                     "flex-deepep": ("flex", "deepep"), "flex-hybridep": ("flex", "hybridep")}
"""stack.MOE_DISPATCHERS -> megatron-core (moe_token_dispatcher_type, moe_flex_dispatcher_backend)."""
MLP_ACTIVATIONS = {"gelu": (False, "gelu"), "swiglu": (True, "silu"), "geglu": (True, "gelu"),
                   "reglu": (True, "relu")}
"""ModelSpec.mlp_kind -> (gated_linear_unit, torch.nn.functional activation)."""
T5_POSITIONS = {"learned": "learned_absolute", "relative": "relative", "rope": "rope"}
"""ModelSpec.position_embedding -> T5Model's position_embedding_type."""
T5_SINGLE_AXES = (
    ("pp", "megatron-core 0.16's pretrain_t5.py raises 'Pipeline parallelism is not supported "
           "for T5'"),
    ("vp", "virtual pipeline stages need pipeline parallelism, which T5 does not have"),
    ("cp", "no megatron-core T5 path splits the sequence over context-parallel ranks"),
    ("ep", "an encoder-decoder model has no experts to split"))
"""Plan axes an encoder-decoder model runs only at 1, and why."""
PAD_TOKEN = 0
"""megatron-core's T5 masks treat token ids below 1 as padding (t5_dataset.py):
synthetic T5 tokens are drawn from 1 up, so every token is attended."""


# ---------------------------------------------------------------- one rank


def run_task(spec: ProfileSpec) -> ProfileResult | None:
    """Run one rank of ``spec``; rank 0 returns the result, a failing rank its failure, others None."""
    refusal = encoder_decoder_refusal(spec.model, spec.plan)
    if refusal:   # every rank refuses alike before any rendezvous: none waits on another
        return ProfileResult.failed(spec, "error", refusal)
    rank, world_size, local_rank, addr, port = _dist_env(spec)
    if spec.device == "cuda":   # read when CUDA's allocator starts, after this
        os.environ.setdefault(*ALLOCATOR_ENV)
    import torch

    result = None
    try:
        result = _run_rank(spec, rank, world_size, local_rank, addr, port)
    except torch.OutOfMemoryError:
        result = ProfileResult.failed(spec, "oom", _error_tail(), world_size)
    except Exception:  # noqa: BLE001 - any failure becomes a record, never a crash
        result = ProfileResult.failed(spec, "error", _error_tail(), world_size)
    finally:
        _teardown()
    if result is not None and (rank == 0 or result.status != "ok"):
        dispatcher, notes = run_choices(spec)
        return dataclasses.replace(result, moe_dispatcher=dispatcher, run_notes="; ".join(notes))
    return None


def encoder_decoder_refusal(model, plan) -> str:
    """'' when the plan runs as asked; for an encoder-decoder model with an axis
    megatron-core's T5 cannot run (T5_SINGLE_AXES), a one-line reason."""
    if not model.is_encoder_decoder:
        return ""
    for axis, why in T5_SINGLE_AXES:
        value = getattr(plan, axis)
        if value != 1:
            return (f"invalid {axis} {value} for encoder-decoder model {model.name!r}: {why}; "
                    f"T5 runs with {axis} 1")
    return ""


def _dist_env(spec: ProfileSpec) -> tuple[int, int, int, str, int]:
    """(rank, world size, local rank, master address, master port) of this process.

    Explicit torchrun-style RANK/WORLD_SIZE win (a torchrun-style launcher sets them,
    even inside a SLURM allocation); else submitit's JobEnvironment; else one rank.
    """
    if not ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        import submitit

        try:
            env = submitit.JobEnvironment()
        except RuntimeError:   # neither submitit nor torchrun: a single rank
            pass
        else:
            # The launcher puts the rendezvous (first node, a per-job port) in the spec.
            return (env.global_rank, env.num_tasks, env.local_rank, spec.master_addr,
                    spec.master_port)
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
            int(os.environ.get("LOCAL_RANK", 0)), os.environ.get("MASTER_ADDR", spec.master_addr),
            int(os.environ.get("MASTER_PORT", spec.master_port)))


def cpu_threads_per_rank(cores: int, ranks_on_node: int) -> int:
    """Intra-op threads of one CPU rank: its share of the cores. torch takes every
    core per process, so N ranks oversubscribe them N times and a gloo collective
    waits on descheduled peers (tiny-t5 TP 2 x DP 2 on 2 cores: 8 s a step instead
    of 0.4 s through the local executor)."""
    return max(1, cores // max(1, ranks_on_node))


def _ranks_on_this_node(world_size: int) -> int:
    """Ranks sharing this machine: torchrun's LOCAL_WORLD_SIZE, else submitit's
    tasks per node, else every rank (a single-node job)."""
    if "LOCAL_WORLD_SIZE" in os.environ:
        return int(os.environ["LOCAL_WORLD_SIZE"])
    import submitit

    try:
        env = submitit.JobEnvironment()
    except RuntimeError:
        return world_size
    return max(1, env.num_tasks // max(1, env.num_nodes))


def _error_tail() -> str:
    return "\n".join(traceback.format_exc().strip().splitlines()[-ERROR_TAIL_LINES:])


def _teardown() -> None:
    import torch

    with contextlib.suppress(Exception):
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
    if torch.distributed.is_initialized():
        with contextlib.suppress(Exception):
            torch.distributed.destroy_process_group()


def _run_rank(spec: ProfileSpec, rank: int, world_size: int, local_rank: int,
              addr: str, port: int) -> ProfileResult:
    import datetime

    import torch

    if spec.world_size != world_size:
        raise ValueError(f"plan needs {spec.world_size} ranks (tp*pp*cp*dp) but the job has "
                         f"{world_size}")
    if spec.device == "cuda":
        torch.cuda.set_device(local_rank)
    elif "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(cpu_threads_per_rank(len(os.sched_getaffinity(0)),
                                                   _ranks_on_this_node(world_size)))
    torch.distributed.init_process_group(
        backend="nccl" if spec.device == "cuda" else "gloo", rank=rank, world_size=world_size,
        init_method=f"tcp://{addr}:{port}",
        timeout=datetime.timedelta(seconds=PROCESS_GROUP_TIMEOUT_S))
    if spec.device == "cpu":
        from autoconfig.profiling.cpu_bridge import cpu_bridge

        bridge = cpu_bridge()
    else:
        bridge = contextlib.nullcontext()
    with bridge:
        return _train_and_measure(spec, world_size)


def _train_and_measure(spec: ProfileSpec, world_size: int) -> ProfileResult:
    import torch
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    spec = dataclasses.replace(spec, model=model_as_run(spec))
    plan = spec.plan
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=plan.tp, pipeline_model_parallel_size=plan.pp,
        virtual_pipeline_model_parallel_size=plan.vp if plan.vp > 1 else None,
        context_parallel_size=plan.cp, expert_model_parallel_size=plan.ep,
        expert_tensor_parallel_size=plan.etp,
        hierarchical_context_parallel_sizes=_hierarchical_cp_sizes(spec))
    torch.manual_seed(spec.seed)
    model_parallel_cuda_manual_seed(spec.seed)

    m = spec.model
    if m.is_encoder_decoder:
        # The schedule, DDP and the optimizer read the model's own config: the decoder's.
        encoder_config, config = (_transformer_config(spec, layers)
                                  for layers in (m.encoder_layers, m.decoder_layers))
        chunks = _build_t5_model(spec, encoder_config, config)
        microbatches = _t5_microbatches_of_this_rank(spec)
    else:
        config = _transformer_config(spec)
        if m.is_moe:
            _define_missing_te_gemm()
        chunks = _build_model(spec, config)
        microbatches = _microbatches_of_this_rank(spec)
    optimizer = _build_optimizer(spec, config, chunks)
    forward_backward = get_forward_backward_func()
    step_times, losses = [], []
    for _ in range(spec.warmup_steps + spec.timed_steps):
        seconds, loss_sum_and_tokens = _one_step(spec, chunks, optimizer, forward_backward,
                                                 microbatches)
        step_times.append(seconds)
        losses.append(loss_sum_and_tokens)
    return _aggregate(spec, world_size, step_times, losses)


def model_as_run(spec: ProfileSpec):
    """The model the worker builds: ``spec.model`` less what this device cannot run
    (multi-latent attention without TransformerEngine becomes grouped-query
    attention with the same heads; a T5 relative position bias, learned absolute
    positions) and less multi-token prediction (not built). ``run_choices`` says
    so in the record."""
    m, changes = spec.model, {}
    if m.attention_kind == "mla" and not _mla_runs_here(spec):
        changes.update(attention_kind="gqa", q_lora_rank=0, kv_lora_rank=0, qk_nope_head_dim=0,
                       qk_rope_head_dim=0, v_head_dim=0)
    if m.mtp_layers:
        changes["mtp_layers"] = 0
    if m.position_embedding == "relative" and not _uses_transformer_engine(spec):
        changes["position_embedding"] = "learned"
    return dataclasses.replace(m, **changes) if changes else m


def run_choices(spec: ProfileSpec) -> tuple[str, list[str]]:
    """(the MoE token dispatcher that runs, "" for a dense model; what the run
    changes from the plan's stack or model, in words, for the record).

    On GPUs the stack's dispatcher and grouped GEMM run as asked (grouped GEMM
    needs TransformerEngine; flex needs TP x EP > 1, else alltoall). On CPU a
    dispatcher that needs CUDA (flex: DeepEP/HybridEP) is replaced by the first
    of ``CPU_MOE_DISPATCHERS``, and the experts run one after another
    (SequentialMLP).
    """
    m, notes, dispatcher = spec.model, [], ""
    if m.is_moe:
        dispatcher = spec.moe_dispatcher
        if dispatcher.startswith("flex") and spec.plan.tp * spec.plan.ep == 1:
            # megatron-core asserts "Flex token dispatcher requires TPxEP > 1"
            dispatcher = "alltoall"
            notes.append(f"MoE dispatcher {spec.moe_dispatcher} needs TP x EP > 1: ran "
                         "alltoall (no tokens leave the rank)")
        elif spec.device == "cpu" and dispatcher not in CPU_MOE_DISPATCHERS:
            dispatcher = CPU_MOE_DISPATCHERS[0]
            notes.append(f"MoE dispatcher {spec.moe_dispatcher} needs CUDA: ran {dispatcher} "
                         "on CPU")
        if spec.moe_grouped_gemm and not _grouped_gemm_runs_here(spec):
            notes.append("grouped GEMM needs TransformerEngine on CUDA: ran the experts one "
                         "after another (SequentialMLP)")
    if spec.plan.cp > 1 and spec.cp_comm_type != "p2p" and _cp_comm_type(spec) is None:
        notes.append(f"context-parallel {spec.cp_comm_type} needs TransformerEngine attention "
                     "on CUDA: ran megatron-core's own context parallelism")
    if m.attention_kind == "mla" and not _mla_runs_here(spec):
        notes.append("multi-latent attention needs TransformerEngine on CUDA: ran grouped-query "
                     "attention with the same heads")
    if m.mtp_layers:
        notes.append(f"the {m.mtp_layers} multi-token-prediction module(s) were not built")
    if m.position_embedding == "relative" and not _uses_transformer_engine(spec):
        notes.append(RELATIVE_BIAS_NOTE)
    if spec.device == "cuda" and not _has_transformer_engine():
        notes.append(LOCAL_LAYERS_NOTE)
    return dispatcher, notes


def _mla_runs_here(spec: ProfileSpec) -> bool:
    if spec.device == "cpu":
        return CPU_RUNS_MLA
    return _has_transformer_engine()


def _grouped_gemm_runs_here(spec: ProfileSpec) -> bool:
    return spec.device == "cuda" and _has_transformer_engine()


# ---------------------------------------------------------------- model


def _stage_split(num_layers: int, plan) -> dict:
    """megatron-core's uneven first/last stage sizes for the plan, when they apply
    to this model (the CPU proxy has fewer layers and runs the even split)."""
    from autoconfig.core.plan import counts_embedding_and_loss, stage_layers
    from autoconfig.errors import InputError
    if not (plan.first_stage_layers or plan.last_stage_layers):
        return {}
    try:
        stage_layers(num_layers, plan)
    except InputError:
        return {}
    if counts_embedding_and_loss(num_layers, plan.pp, plan.first_stage_layers,
                                 plan.last_stage_layers):
        # The split Megatron makes itself; with virtual stages only this form is allowed.
        return {"account_for_embedding_in_pipeline_split": True,
                "account_for_loss_in_pipeline_split": True}
    return {"num_layers_in_first_pipeline_stage": plan.first_stage_layers or None,
            "num_layers_in_last_pipeline_stage": plan.last_stage_layers or None}


def _recompute_fields(plan, layers_per_chunk: int) -> dict:
    """TransformerConfig recompute fields of the plan for a chunk of ``layers_per_chunk`` layers."""
    if plan.recompute == "selective":
        return {"recompute_granularity": "selective"}
    if plan.recompute != "full":
        return {}
    if plan.recompute_method == "block":
        # 0 = every layer of the stage; more than the chunk holds is clamped.
        count = min(plan.recompute_num_layers or layers_per_chunk, layers_per_chunk)
    else:
        # uniform: checkpoint groups of N layers (every layer is recomputed); 0 -> 1 per group.
        count = min(plan.recompute_num_layers or 1, layers_per_chunk)
    return {"recompute_granularity": "full", "recompute_method": plan.recompute_method,
            "recompute_num_layers": count}


def _transformer_config(spec: ProfileSpec, num_layers: int | None = None):
    """megatron-core's config of the model's stack, or of one stack of ``num_layers``
    layers (an encoder-decoder model's encoder or decoder)."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    m, plan, on_gpu = spec.model, spec.plan, spec.device == "cuda"
    layers = m.num_layers if num_layers is None else num_layers
    dtype = torch.bfloat16 if on_gpu else torch.float32
    recompute = _recompute_fields(plan, layers // (plan.pp * plan.vp))
    gated, activation = MLP_ACTIVATIONS[m.mlp_kind]
    config_class, attention = TransformerConfig, {}
    if m.attention_kind == "mla":   # model_as_run: only where it runs
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        config_class = MLATransformerConfig
        attention = {"q_lora_rank": m.q_lora_rank or None, "kv_lora_rank": m.kv_lora_rank,
                     "qk_head_dim": m.qk_nope_head_dim, "qk_pos_emb_head_dim": m.qk_rope_head_dim,
                     "v_head_dim": m.v_head_dim, "rope_type": "rope",
                     # MLA's latent norms (Megatron-LM runs DeepSeek with --qk-layernorm)
                     "qk_layernorm": True}
    else:
        attention = {"kv_channels": m.kv_channels or None, "qk_layernorm": m.qk_norm}
    # Banded layers and sinks as the launch files give them (megatron-core's local
    # attention runs both on CPU: a window mask, a learnable offset in its softmax).
    if m.sliding_window:
        attention.update(window_size=window_size(m), window_attn_skip_freq=SKIP_WINDOW_EVERY)
    if m.attention_sinks:
        attention["softmax_type"] = "learnable"
    return config_class(
        **_stage_split(layers, plan), **attention, **_moe_config(spec),
        num_layers=layers, hidden_size=m.hidden_size, num_attention_heads=m.num_heads,
        num_query_groups=m.num_kv_heads, ffn_hidden_size=m.ffn_hidden_size,
        tensor_model_parallel_size=plan.tp, pipeline_model_parallel_size=plan.pp,
        virtual_pipeline_model_parallel_size=plan.vp if plan.vp > 1 else None,
        context_parallel_size=plan.cp, sequence_parallel=plan.sp,
        cp_comm_type=_cp_comm_type(spec),
        hierarchical_context_parallel_sizes=_hierarchical_cp_sizes(spec),
        hidden_dropout=0.0, attention_dropout=0.0,
        gated_linear_unit=gated, activation_func=getattr(F, activation),
        normalization="RMSNorm" if m.norm_kind == "rmsnorm" else "LayerNorm",
        add_bias_linear=m.has_bias, init_method_std=INIT_METHOD_STD,
        bf16=on_gpu, params_dtype=dtype, pipeline_dtype=dtype,
        # Batched p2p pairs sends wrongly with virtual stages when both pipeline
        # neighbours are the same rank (PP=2): wrong losses, no error.
        batch_p2p_comm=plan.vp == 1,
        # As Megatron-LM does; its backward calls the autograd engine directly, which
        # also keeps the CPU bridge's function mode active in the recompute forward.
        deallocate_pipeline_outputs=True,
        use_cpu_initialization=not on_gpu,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=on_gpu and not gated and m.has_bias,
        masked_softmax_fusion=False, bias_dropout_fusion=on_gpu, apply_rope_fusion=False,
        persist_layer_norm=False, **recompute)


def _moe_config(spec: ProfileSpec) -> dict:
    """TransformerConfig fields of an MoE model: experts, router, dispatcher, EP/ETP."""
    m, plan = spec.model, spec.plan
    if not m.is_moe:
        return {}
    dispatcher, _ = run_choices(spec)
    dispatcher_type, backend = MCORE_DISPATCHERS[dispatcher]
    return {
        "num_moe_experts": m.num_experts, "moe_router_topk": m.moe_topk,
        "moe_ffn_hidden_size": m.moe_ffn_hidden_size,
        "moe_shared_expert_intermediate_size": m.moe_shared_expert_ffn_hidden_size or None,
        # One entry per layer: 1 MoE, 0 dense (leading dense layers, then every n-th).
        "moe_layer_freq": [int(layer == "moe") for layer in m.layer_pattern],
        "moe_token_dispatcher_type": dispatcher_type,
        **({"moe_flex_dispatcher_backend": backend} if backend else {}),
        "moe_grouped_gemm": spec.moe_grouped_gemm and _grouped_gemm_runs_here(spec),
        "expert_model_parallel_size": plan.ep, "expert_tensor_parallel_size": plan.etp,
        # Megatron-LM's defaults: dropless, no capacity factor, aux loss coefficient 0.
        "moe_router_load_balancing_type": "aux_loss", "moe_aux_loss_coeff": 0.0,
        "moe_permute_fusion": False, "moe_router_fusion": False,
    }


def _define_missing_te_gemm() -> None:
    """megatron-core 0.16.1's MoE router reads ``te_general_gemm``, which its
    moe_utils module defines only when TransformerEngine imports: without TE
    every MoE forward raises NameError. Define it as None (the plain torch.mm
    path the router falls back to) when TE is absent."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def _block_spec(spec: ProfileSpec, config, vp_stage):
    """The layers of one (virtual) pipeline stage, dense or MoE per ``moe_layer_freq``.

    On GPUs with TransformerEngine installed its specs (fused norms, flash
    attention, grouped GEMM experts when asked), as real Megatron-LM runs use.
    Else megatron-core's local specs (unfused attention: slower and more memory
    than a production run) with torch norms that support sequence parallel.
    """
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    if _uses_transformer_engine(spec):
        return get_gpt_decoder_block_spec(config, use_transformer_engine=True, vp_stage=vp_stage)
    block = get_gpt_decoder_block_spec(
        config, use_transformer_engine=False,
        normalization="RMSNorm" if spec.model.norm_kind == "rmsnorm" else "LayerNorm",
        vp_stage=vp_stage)
    return _with_norm(block, _local_norm_classes(), _sequence_parallel_norm_class())


def _t5_block_specs(spec: ProfileSpec) -> tuple:
    """(encoder block, decoder block) of an encoder-decoder model, TransformerEngine's
    on GPUs that have it, as ``_block_spec`` chooses for GPT.

    megatron-core's local T5 block helpers name TENorm as the stacks' final norm,
    None without TE: the local blocks are built here with a torch norm (one that
    supports sequence parallel) in every norm's place.
    """
    from megatron.core.models.T5 import t5_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    m = spec.model
    if _uses_transformer_engine(spec):
        return (t5_spec.get_t5_encoder_with_transformer_engine_block_spec(m.encoder_layers),
                t5_spec.get_t5_decoder_with_transformer_engine_block_spec(m.decoder_layers))
    norm = _sequence_parallel_norm_class()
    blocks = (TransformerBlockSubmodules([t5_spec.encoder_model_with_local_spec()]
                                         * m.encoder_layers, layer_norm=norm),
              TransformerBlockSubmodules([t5_spec.decoder_model_with_local_spec()]
                                         * m.decoder_layers, layer_norm=norm))
    return tuple(_with_norm(block, _local_norm_classes(), norm) for block in blocks)


def _cp_comm_type(spec: ProfileSpec) -> str | None:
    """megatron-core's cp_comm_type for the stack's scheme: only Transformer
    Engine's attention has the schemes (None: megatron-core's default, the ring)."""
    if spec.plan.cp <= 1 or not _uses_transformer_engine(spec):
        return None
    return spec.cp_comm_type


def _hierarchical_cp_sizes(spec: ProfileSpec) -> list[int] | None:
    """[all-to-all group, ring] for a2a+p2p (megatron-core builds both groups)."""
    if _cp_comm_type(spec) != "a2a+p2p":
        return None
    return [spec.cp_a2a_size, spec.plan.cp // spec.cp_a2a_size]


def _uses_transformer_engine(spec: ProfileSpec) -> bool:
    return spec.device == "cuda" and _has_transformer_engine()


@functools.lru_cache(maxsize=None)
def _has_transformer_engine() -> bool:
    try:
        import transformer_engine  # noqa: F401
    except ImportError:
        return False
    return True


def _local_norm_classes() -> tuple:
    from megatron.core.models.gpt import gpt_layer_specs
    from megatron.core.models.T5 import t5_spec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    return tuple({WrappedTorchNorm, getattr(gpt_layer_specs, "LNImpl", WrappedTorchNorm),
                  getattr(t5_spec, "LNImpl", WrappedTorchNorm)})


def _with_norm(node, old: tuple, new):
    """``node`` (a spec, submodules dataclass or list of them) with every norm
    class in ``old`` replaced by ``new``: layer norms, the final norm, Q/K norms."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    if isinstance(node, type):
        return new if node in old else node
    if isinstance(node, ModuleSpec):
        return dataclasses.replace(node, module=_with_norm(node.module, old, new),
                                   submodules=_with_norm(node.submodules, old, new))
    if isinstance(node, (list, tuple)):
        return type(node)(_with_norm(item, old, new) for item in node)
    if dataclasses.is_dataclass(node):
        return dataclasses.replace(node, **{f.name: _with_norm(getattr(node, f.name), old, new)
                                            for f in dataclasses.fields(node) if f.init})
    return node


def _sequence_parallel_norm_class():
    """torch LayerNorm/RMSNorm whose params are tagged for sequence parallel.

    megatron-core's WrappedTorchNorm refuses sequence parallel; Apex's fused norm
    tags its parameters ``sequence_parallel=True`` so finalize_model_grads
    all-reduces their grads across TP. Doing the same with torch's norm gives the
    same losses as TP without SP.
    """
    import torch

    class SequenceParallelTorchNorm:
        # A class, not a function: megatron's build_module calls classes but
        # returns plain functions uncalled. __new__ returns the torch module.
        def __new__(cls, config, hidden_size, eps=1e-5, **_unused):
            if config.normalization == "RMSNorm":
                norm = torch.nn.RMSNorm(hidden_size, eps=eps, dtype=config.params_dtype)
            else:
                norm = torch.nn.LayerNorm(hidden_size, eps=eps, dtype=config.params_dtype)
            for param in norm.parameters():
                param.sequence_parallel = config.sequence_parallel
            return norm

    return SequenceParallelTorchNorm


def _padded_vocab(spec: ProfileSpec) -> int:
    multiple = VOCAB_PAD_MULTIPLE * spec.plan.tp
    return -(-spec.model.vocab_size // multiple) * multiple


def _build_model(spec: ProfileSpec, config) -> list:
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_model import GPTModel

    m, plan = spec.model, spec.plan
    chunks = []
    for vp_stage in range(plan.vp):
        stage = vp_stage if plan.vp > 1 else None
        block = _block_spec(spec, config, stage)
        model = GPTModel(
            config=config, transformer_layer_spec=block, vocab_size=_padded_vocab(spec),
            max_sequence_length=spec.workload.seq_len,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=stage),
            share_embeddings_and_output_weights=m.tied_embeddings,
            position_embedding_type="rope" if m.position_embedding == "rope" else "learned_absolute",
            vp_stage=stage)
        if spec.device == "cuda":
            model.cuda(torch.cuda.current_device())
        _redraw_weights(spec, config, model, stage)
        chunks.append(model)
    return _wrap_for_training(spec, config, chunks)


def _build_t5_model(spec: ProfileSpec, encoder_config, config) -> list:
    """One megatron-core T5Model (pp 1: the whole encoder and decoder on every rank),
    wrapped for training like a GPT chunk."""
    import torch
    from megatron.core.models.T5 import T5Model

    from autoconfig.core.model import RELATIVE_ATTENTION_BUCKETS

    m = spec.model
    encoder_block, decoder_block = _t5_block_specs(spec)
    model = T5Model(
        config=config, encoder_config=encoder_config,
        transformer_encoder_layer_spec=encoder_block, transformer_decoder_layer_spec=decoder_block,
        vocab_size=_padded_vocab(spec),
        # Learned positions cover the longer of the two sequences (the encoder's for T5).
        max_sequence_length=max(spec.workload.seq_len, m.decoder_seq_len),
        share_embeddings_and_output_weights=m.tied_embeddings,
        position_embedding_type=T5_POSITIONS[m.position_embedding],
        relative_attention_num_buckets=RELATIVE_ATTENTION_BUCKETS)
    if spec.device == "cuda":
        model.cuda(torch.cuda.current_device())
    _redraw_weights(spec, config, model, None)
    return _wrap_for_training(spec, config, [model])


def _wrap_for_training(spec: ProfileSpec, config, chunks: list) -> list:
    """Megatron DDP around each chunk (Float16Module first on GPUs), params broadcast."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.transformer.module import Float16Module

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, overlap_grad_reduce=spec.device == "cuda",
        use_distributed_optimizer=spec.plan.distributed_optimizer)
    wrapped = []
    for index, model in enumerate(chunks):
        if spec.device == "cuda":
            model = Float16Module(config, model)
        # Megatron-LM buckets only the first chunk's grads with virtual stages.
        wrapped.append(DistributedDataParallel(config, ddp_config, model,
                                               disable_bucketing=index > 0))
    for model in wrapped:
        model.broadcast_params()
    return wrapped


def _redraw_weights(spec: ProfileSpec, config, model, vp_stage) -> None:
    """Draw every matrix from (seed, global name) on its full shape, then keep this rank's shard.

    Megatron's own init depends on the layout (each pipeline stage starts from
    the same RNG state), so PP1 and PP2 would start from different weights.
    Routed experts are named by their global index (EP rank * local experts +
    local index) and split over the expert tensor-parallel group, so every EP
    and ETP layout starts from the same experts too. Vectors (norm weights,
    biases) are deterministic already and are kept.
    """
    import torch
    from megatron.core import parallel_state
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    groups = {False: (parallel_state.get_tensor_model_parallel_world_size(),
                      parallel_state.get_tensor_model_parallel_rank()),
              True: (parallel_state.get_expert_tensor_parallel_world_size(),
                     parallel_state.get_expert_tensor_parallel_rank())}
    local_experts = spec.model.num_experts // spec.plan.ep if spec.model.is_moe else 0
    expert_offset = parallel_state.get_expert_model_parallel_rank() * local_experts
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
    scaled_std = INIT_METHOD_STD / (2.0 * spec.model.num_layers) ** 0.5
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() < 2:
                continue
            key = _global_name(name, offset, spec.model.tied_embeddings, expert_offset)
            std = scaled_std if _OUTPUT_PROJECTION.search(key) else INIT_METHOD_STD
            size, rank = groups[".mlp.experts." in key]
            partitioned = getattr(param, "tensor_model_parallel", False) and size > 1
            dim = getattr(param, "partition_dim", 0)
            shape = list(param.shape)
            if partitioned:
                shape[dim] *= size
            generator = torch.Generator(device=param.device)
            generator.manual_seed(zlib.crc32(f"{spec.seed}:{key}".encode()))
            full = torch.empty(shape, dtype=torch.float32, device=param.device)
            full.normal_(0.0, std, generator=generator)
            if partitioned and config.gated_linear_unit and _GATED_INPUT.search(key):
                # Each TP rank holds [gate shard; up shard], not a contiguous slice.
                gate, up = full.chunk(2, dim=0)
                shard = torch.cat([gate.chunk(size, dim=0)[rank], up.chunk(size, dim=0)[rank]])
            elif partitioned:
                shard = full.chunk(size, dim=dim)[rank]
            else:
                shard = full
            param.copy_(shard)


_OUTPUT_PROJECTION = re.compile(r"(linear_proj|linear_fc2)\.weight\d*$")
_GATED_INPUT = re.compile(r"linear_fc1\.weight\d*$")
_LOCAL_EXPERT = re.compile(r"(\.mlp\.experts\.local_experts\.)(\d+)(\.)")
_GROUPED_EXPERT = re.compile(r"(\.mlp\.experts\.linear_fc[12]\.weight)(\d+)$")


def _global_name(name: str, layer_offset: int, tied: bool, expert_offset: int = 0) -> str:
    """Parameter name with the global layer and expert index; a tied output layer is
    the embedding. Experts are named as SequentialMLP names them (``local_experts.K.``),
    also when grouped GEMM holds them as ``linear_fc1.weightK``."""
    parts = name.split(".")
    if len(parts) > 2 and parts[0] == "decoder" and parts[1] == "layers":
        parts[2] = str(int(parts[2]) + layer_offset)
    name = ".".join(parts)
    name = _LOCAL_EXPERT.sub(lambda m: f"{m[1]}{int(m[2]) + expert_offset}{m[3]}", name)
    grouped = _GROUPED_EXPERT.search(name)
    if grouped:
        stem, fc = name[:grouped.start()], grouped[1].rsplit(".", 2)[-2]
        name = f"{stem}.mlp.experts.local_experts.{int(grouped[2]) + expert_offset}.{fc}.weight"
    if tied and name == "output_layer.weight":
        return "embedding.word_embeddings.weight"
    return name


def _build_optimizer(spec: ProfileSpec, config, chunks):
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    on_gpu = spec.device == "cuda"
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=ADAM_LR, weight_decay=0.0, clip_grad=1.0,
                        bf16=on_gpu, params_dtype=config.params_dtype,
                        use_distributed_optimizer=spec.plan.distributed_optimizer),
        chunks)
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    if spec.device == "cuda":  # overlap_grad_reduce is on: let the schedule drive grad sync
        no_sync = [chunk.no_sync for chunk in chunks]
        config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    return optimizer


# ---------------------------------------------------------------- data and steps


def _microbatches_of_this_rank(spec: ProfileSpec) -> list[dict]:
    """Synthetic tokens: the global batch drawn from the seed, sliced by DP rank, then
    micro-batch, then (with context parallel) sequence chunk. Same data for every plan."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.utils import get_batch_on_this_cp_rank

    plan, seq = spec.plan, spec.workload.seq_len
    gbs = spec.workload.global_batch_size
    generator = torch.Generator().manual_seed(spec.seed)
    tokens = torch.randint(0, spec.model.vocab_size, (gbs, seq + 1), generator=generator)
    positions = torch.arange(seq).unsqueeze(0).expand(plan.mbs, seq)
    batches = []
    for rows in _microbatch_rows(gbs, plan.mbs, plan.dp, parallel_state.get_data_parallel_rank()):
        batch = {"tokens": tokens[rows, :-1].contiguous(), "labels": tokens[rows, 1:].contiguous(),
                 "position_ids": positions.contiguous()}
        batch = get_batch_on_this_cp_rank(batch)
        batches.append(_to_device(batch, _device(spec)))
    return batches


def _t5_microbatches_of_this_rank(spec: ProfileSpec) -> list[dict]:
    """Synthetic T5 batches, sliced like ``_microbatches_of_this_rank``: encoder tokens
    [b, seq_len], decoder tokens and next-token labels [b, decoder_seq_len], a loss
    mask, and the three attention masks megatron-core's T5 dataset makes for the
    spec that runs (local: [b, 1, q, k]; TransformerEngine: padding masks)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.datasets.t5_dataset import T5MaskedWordPieceDataset

    plan, m = spec.plan, spec.model
    gbs, enc_len, dec_len = spec.workload.global_batch_size, spec.workload.seq_len, m.decoder_seq_len
    generator = torch.Generator().manual_seed(spec.seed)
    encoder = torch.randint(PAD_TOKEN + 1, m.vocab_size, (gbs, enc_len), generator=generator)
    target = torch.randint(PAD_TOKEN + 1, m.vocab_size, (gbs, dec_len + 1), generator=generator)
    batches = []
    for rows in _microbatch_rows(gbs, plan.mbs, plan.dp, parallel_state.get_data_parallel_rank()):
        enc, dec, labels = encoder[rows], target[rows, :-1], target[rows, 1:]
        enc_mask, dec_mask, enc_dec_mask = T5MaskedWordPieceDataset.config_attention_mask(
            enc, dec, enc == PAD_TOKEN, dec == PAD_TOKEN,
            use_local=not _uses_transformer_engine(spec))
        batch = {"text_enc": enc.contiguous(), "text_dec": dec.contiguous(),
                 "labels": labels.contiguous(), "loss_mask": (labels != PAD_TOKEN).float(),
                 "enc_mask": enc_mask, "dec_mask": dec_mask, "enc_dec_mask": enc_dec_mask}
        batches.append(_to_device(batch, _device(spec)))
    return batches


def _microbatch_rows(gbs: int, mbs: int, dp: int, dp_rank: int) -> list[slice]:
    """Rows of the global batch in each micro-batch of data-parallel rank ``dp_rank``."""
    if gbs % (mbs * dp):
        raise ValueError(f"global batch {gbs} is not divisible by mbs*dp = {mbs * dp}")
    per_rank = gbs // dp
    first = dp_rank * per_rank
    return [slice(start, start + mbs) for start in range(first, first + per_rank, mbs)]


def _device(spec: ProfileSpec):
    import torch

    if spec.device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _to_device(value, device):
    """Tensors of a batch on ``device``; dicts, tuples (TE's cross-attention mask pair)
    and None (the decoder mask TE's causal attention does without) kept as they are."""
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, tuple):
        return tuple(_to_device(v, device) for v in value)
    return None if value is None else value.to(device)


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    output = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return output, functools.partial(_loss_func, None)


def _t5_forward_step(data_iterator, model):
    """T5Model's forward as Megatron-LM's pretrain_t5.py calls it: per-token losses out."""
    batch = next(data_iterator)
    output = model(batch["text_enc"], batch["text_dec"], batch["enc_mask"], batch["dec_mask"],
                   batch["enc_dec_mask"], lm_labels=batch["labels"])
    return output, functools.partial(_loss_func, batch["loss_mask"])


def _loss_func(loss_mask, output_tensor):
    """(loss sum, tokens, report) of per-token losses; ``loss_mask`` None counts every token."""
    import torch

    per_token = output_tensor.float()
    if loss_mask is None:
        total = per_token.sum()
        count = torch.tensor(per_token.numel(), dtype=torch.int, device=per_token.device)
    else:
        total = (per_token * loss_mask).sum()
        count = loss_mask.sum().to(torch.int)
    # The schedule divides ``total`` in place: report a clone.
    return total, count, {"loss_sum": total.detach().clone(), "tokens": count.clone()}


def _one_step(spec: ProfileSpec, chunks, optimizer, forward_backward, microbatches):
    """One optimizer step; (seconds, (loss sum, tokens) seen by this rank's last stage)."""
    plan = spec.plan
    iterators = [iter(microbatches) for _ in chunks]
    _synchronize(spec)
    start = time.perf_counter()
    for chunk in chunks:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    reported = forward_backward(
        forward_step_func=_t5_forward_step if spec.model.is_encoder_decoder else _forward_step,
        data_iterator=iterators if len(chunks) > 1 else iterators[0],
        model=chunks if len(chunks) > 1 else chunks[0],
        num_microbatches=len(microbatches), seq_length=spec.workload.seq_len,
        micro_batch_size=plan.mbs, forward_only=False)
    optimizer.step()
    _synchronize(spec)
    seconds = time.perf_counter() - start
    loss_sum = sum(float(r["loss_sum"]) for r in reported)
    tokens = sum(int(r["tokens"]) for r in reported)
    return seconds, (loss_sum, tokens)


def _synchronize(spec: ProfileSpec) -> None:
    import torch

    if spec.device == "cuda":
        torch.cuda.synchronize()


def _aggregate(spec: ProfileSpec, world_size: int, step_times: list[float],
               losses: list[tuple[float, int]]) -> ProfileResult:
    """Reduce over ranks: iteration time and memory by max, losses by token-weighted mean."""
    import torch

    device = _device(spec)
    times = torch.tensor(step_times, dtype=torch.float64, device=device)
    torch.distributed.all_reduce(times, op=torch.distributed.ReduceOp.MAX)
    # Every TP rank of the last stage holds the same loss: the factor cancels in sum/tokens.
    sums = torch.tensor([[s, n] for s, n in losses], dtype=torch.float64, device=device)
    torch.distributed.all_reduce(sums)
    memory = torch.tensor([peak_memory_bytes(spec), _peak_allocated_bytes(spec)],
                          dtype=torch.float64, device=device)
    torch.distributed.all_reduce(memory, op=torch.distributed.ReduceOp.MAX)
    device_peak, allocated_peak = (int(x) for x in memory.tolist())

    iteration_times = tuple(float(t) for t in times.tolist())
    step_time = statistics.median(iteration_times[spec.warmup_steps:])
    # samples x seq_len: for T5 the encoder's tokens, as NeMo counts T5's throughput
    # (model_flops_per_token is per encoder token too).
    tokens_per_step = spec.workload.tokens_per_step
    tokens_per_s_per_gpu = tokens_per_step / step_time / world_size
    flops = model_flops_per_token(spec.model, spec.workload.seq_len)
    return ProfileResult(
        plan=spec.plan, status="ok", device=spec.device, world_size=world_size,
        step_time_s=step_time, iteration_times_s=iteration_times,
        tokens_per_s_per_gpu=tokens_per_s_per_gpu,
        model_tflops_per_gpu=flops * tokens_per_s_per_gpu / 1e12,
        peak_memory_bytes=device_peak, peak_allocated_bytes=allocated_peak or None,
        losses=tuple(float(s / n) for s, n in sums.tolist()), model_name=spec.model.name)


def peak_memory_bytes(spec) -> int:
    """Device memory at the peak, as the memory model counts it: the allocator's
    reserved peak (its tensors and the cache they fragment) plus the memory it
    does not hold (CUDA context, cuBLAS workspaces, NCCL buffers), read as used
    minus reserved after the last step. max_memory_allocated alone left out both:
    on an H200 it read 97.9 GiB for a plan predicted at 93.0 GiB of device memory,
    of which 86.2 GiB are tensors. On CPU the resident set size. The training and
    the inference worker record it alike."""
    import torch

    if spec.device == "cuda":
        free, total = torch.cuda.mem_get_info()
        outside = max(total - free - torch.cuda.memory_reserved(), 0)
        return int(torch.cuda.max_memory_reserved() + outside)
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024   # KiB on Linux


def _peak_allocated_bytes(spec: ProfileSpec) -> int:
    """The tensors' own peak on GPU (0 on CPU, where the RSS is all there is)."""
    import torch

    return int(torch.cuda.max_memory_allocated()) if spec.device == "cuda" else 0


# ---------------------------------------------------------------- entry point


def main(argv: list[str] | None = None) -> int:
    """``python -m autoconfig.profiling.worker --spec-json JSON [--result-dir DIR]``: one rank."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec-json", required=True, help="ProfileSpec.to_json() text")
    parser.add_argument("--result-dir", help="write result-rank<R>.json here (rank 0, or a failure)")
    args = parser.parse_args(argv)
    spec = ProfileSpec.from_json(args.spec_json)
    result = run_task(spec)
    if result is None:
        return 0
    text = json.dumps(result.to_dict())
    if args.result_dir:
        rank = int(os.environ.get("RANK", 0))
        path = Path(args.result_dir) / f"result-rank{rank}.json"
        partial = path.with_suffix(".tmp")
        partial.write_text(text)
        partial.replace(path)   # atomic: the launcher never reads half a record
    else:
        print(text)
    return 0 if result.status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
