"""Serving engines: what the inference software does, as named, sourced data.

An engine (``heuristics/engines/<name>.yaml``) says how it batches (static or
in-flight), how it keeps the KV cache (contiguous or paged, block size), which
all-reduce it runs at which message size, what an engine step costs on the host
and per kernel launch, and how well its decode attention streams the KV cache.
The latency model asks "does this engine launch through CUDA graphs?", never
"which engine is this?"; users pick one with ``infer --engine``.
"""

import dataclasses
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from autoconfig.errors import CatalogError, InputError, shown
from autoconfig.paths import heuristics_dir
from autoconfig.yamlio import load_yaml, sourced_field

DEFAULT_ENGINE = "tensorrt-llm"
DEFAULT_REASON = ("NVIDIA's production serving engine (in-flight batching, paged KV cache, "
                  "custom all-reduce) and the default back end of NVIDIA's AIConfigurator; "
                  "FasterTransformer, the seed tool's engine, is its deprecated predecessor")
"""Why the default is what it is (printed beside every answer)."""
BATCHING = ("static", "continuous")
MAX_DECODE_STEPS = 256
MAX_BATCHED_TOKENS = 1 << 20
"""Largest token budget per step accepted from the command line (a million tokens)."""
MAX_KV_CACHE_TOKENS = 1 << 30
"""Largest KV pool accepted from the command line (a billion tokens)."""
"""Largest --decode-steps asked (SGLang's docs show runs at 256)."""
KV_CACHES = ("contiguous", "paged")


@dataclass(frozen=True)
class NewTokenRatio:
    """SGLang's admission estimate (``PrefillAdder``): a running request holds back
    ``ratio`` x its remaining output (clipped to ``clip_tokens``) of the free KV
    pool, a request joining holds its prompt and whole (clipped) output; the
    ratio starts at ``initial``, falls by ``(initial - minimum) / decay_steps`` a
    decode step to ``minimum``, and when decode runs out of KV the newest requests
    are retracted until ``retract_steps`` steps fit, the ratio reset to the running
    requests' decoded share (plus those steps) of their outputs."""

    initial: float
    minimum: float
    decay_steps: int
    retract_steps: int
    clip_tokens: int

    @property
    def decay_per_step(self) -> float:
        return (self.initial - self.minimum) / self.decay_steps


LAYER_SPLITS = ("even", "balanced", "ceil")
"""How an engine deals a model's layers to its pipeline stages
(``Engine.pipeline_layers``): ``even``, L/pp each, so pp must divide L;
``balanced``, floor or ceil of L/pp each, any pp up to L; ``ceil``, ceil(L/pp)
each and the rest to the last stage, which must keep a layer."""
DECODE_SPLITS = ("chosen", "per_stage", "threshold", "whole")
PREFILL_SPLITS = ("chosen", "per_stage", "whole")


@dataclass(frozen=True)
class PipelineSplit:
    """How a static batch is cut into micro-batches over ``pp`` pipeline stages,
    per phase (``latency._static``):

    - ``chosen``: a setting the planner picks, the fastest power-of-two count;
    - ``per_stage``: the engine's fixed rule, ``b / pp`` requests a micro-batch
      when ``pp`` divides the batch, else the whole batch, and for a prefill
      halved (while even) until it holds at most ``prefill_max_tokens`` prompt
      tokens (FasterTransformer's ``getLocalBatchSize``);
    - ``threshold`` (decode): a decode step is cut by the batch x tokens threshold
      the prefill's micro-batches set (megatron-core's
      ``inference_batch_times_seqlen_threshold``): ``b / m_p`` requests x ``s_in``
      tokens, so decode steps of ``b`` one-token sequences run whole unless the
      prefill had more micro-batches than prompt tokens;
    - ``whole``: never cut, each forward carries the whole batch through the
      stages in turn (megatron-core's dynamic engine: one pass a step).

    ``decode_overlaps_steps``: whether the micro-batches of one decode step run
    beside those of the next (in-flight engines keep ``pp`` of them in flight,
    so a step costs ``max(m, pp)`` stage times), or each step is one pipeline
    pass that fills and drains before the last stage samples and broadcasts the
    new tokens to every stage (``m + pp - 1``). An in-flight engine of the second
    kind runs its steps whole: one micro-batch, the step's every token, crosses
    the ``pp`` stages in turn."""

    decode: str = "chosen"
    prefill: str = "chosen"
    prefill_max_tokens: int | None = None
    decode_overlaps_steps: bool = True

    def lanes(self, pp):
        """Micro-batches an in-flight engine keeps in flight over ``pp`` stages."""
        return pp if self.decode_overlaps_steps else np.ones_like(pp)

    def decode_stage_passes(self, microbatches, pp):
        """Stage times one decode step takes with ``microbatches`` over ``pp`` stages."""
        if self.decode_overlaps_steps:
            return np.maximum(microbatches, pp)
        return microbatches + pp - 1.0


KV_POOL_BASES = ("free", "total", "static")
"""What an engine's KV memory share is a share of (``KvPoolRule``)."""
RESERVE_TERMS = ("base_mib", "mib_per_chunk_token", "min_chunk_tokens", "mib_per_graph_seq",
                 "mib_per_replica_gpu", "floor_mib", "floor_above_gib")
"""The terms of a reserve rule (``KvPoolRule.reserve``), all required."""


@dataclass(frozen=True)
class KvPoolRule:
    """How a paged engine sizes its KV pool at start (bytes per GPU, ``T`` the
    GPU's memory, ``W`` weights, ``A`` the largest forward's activations, ``C``
    the runtime context):

    - ``free``: ``share x (T - W - A - C)``, a share of what is free once the
      model is loaded and a forward was profiled (TensorRT-LLM
      ``free_gpu_memory_fraction``);
    - ``total``: ``share x T - (W + A + C)``, the engine's whole footprint held to
      a share of the GPU (vLLM ``--gpu-memory-utilization``);
    - ``static``: ``share x T - (W + C)``, weights and pool held to a share, the
      rest left for activations and graphs (SGLang ``--mem-fraction-static``).

    ``share`` or, where the engine derives it, ``reserve``: the MiB it keeps out
    of the share, ``base + per chunk token x max(budget, min chunk) + per graph
    sequence x the engine's largest graph batch (``Engine.graph_max_seqs``) + per
    replica GPU x TP x PP``, at least ``floor``
    on GPUs over ``floor_above_gib`` (SGLang's ``_handle_gpu_memory_settings``),
    so ``share = 1 - reserve / T``."""

    of: str
    share: float | None = None
    reserve: tuple[tuple[str, float], ...] = ()

    def share_of(self, total_bytes: float, budget_tokens, tp, pp, graph_seqs=0):
        """The share at this GPU memory, step budget, layout and largest decode
        batch captured as a CUDA graph (arrays allowed)."""
        if self.share is not None:
            return self.share
        r = dict(self.reserve)
        graph = np.asarray(graph_seqs, dtype=float)
        mib = (r["base_mib"] + r["mib_per_chunk_token"] * max(budget_tokens or 0,
                                                              r["min_chunk_tokens"])
               + r["mib_per_graph_seq"] * graph
               + r["mib_per_replica_gpu"] * np.asarray(tp) * np.asarray(pp))
        if total_bytes > r["floor_above_gib"] * 2**30:
            mib = np.maximum(mib, r["floor_mib"])
        return 1.0 - mib * 2**20 / total_bytes


@dataclass(frozen=True)
class Engine:
    """What one serving engine does, where it changes latency or memory."""

    name: str
    display_name: str
    version: str
    batching: str
    """static: a batch runs start to end together; continuous: requests join and
    leave the running batch every step (iteration-level scheduling, Yu et al. 2022, Orca)."""
    kv_cache: str
    kv_block_tokens: int | None
    """Tokens per paged KV block (None: contiguous, allocated for the whole sequence)."""
    chunked_prefill: bool
    mixed_prefill: bool
    """A step that prefills also decodes the running sequences (one token budget,
    Sarathi-Serve / Orca); False: prefill-first, a prefill forward runs alone and
    the decoding sequences wait for it (vLLM V0's default scheduler, SGLang
    without ``--enable-mixed-chunk``)."""
    prefill_samples_first_token: bool
    """The step that finishes a prompt samples its first token (every engine that
    computes the last prompt token's logits in its prefill); False: the prefill
    stops one token short and the next decode step, after every prompt the
    scheduler admitted with it, samples the first token (TurboMind before its
    unified prefill/decode pass)."""
    max_batched_tokens: int | None
    """Token budget of one engine step (prompt chunks plus decode tokens)."""
    max_num_seqs: int | None
    """Default cap on running sequences per replica."""
    kv_reserves_output: bool
    """A request is admitted only when the KV cache can hold its whole prompt and
    output (else on its prompt, preempting requests when the cache runs out)."""
    cuda_graphs: bool
    one_shot_max_bytes: float | None
    """All-reduces up to this size run the engine's one-shot kernel (None: never)."""
    two_shot_max_bytes: float | None
    """Up to this size two-shot; above it (or beyond ``max_custom_tp``) NCCL's ring."""
    max_custom_tp: int
    step_overhead_s: float
    """Host time per engine step that the GPU waits for (scheduling, sampling,
    input preparation); 0 where the engine overlaps it with the previous step.
    With ``decode_steps`` > 1 a run of decode steps pays it once."""
    overlap_schedule: bool
    """The scheduler runs one batch ahead of the GPU (SGLang's overlap event loop,
    TensorRT-LLM's overlap scheduler, vLLM's async scheduling): it builds step
    k + 1 while step k runs, so a request that arrives during step k can first
    join step k + 2. Its first token comes one step later than under a scheduler
    that builds each step after the last ends; what it hides of the host's time is
    the engine's ``step_overhead_s``, not changed here."""
    decode_steps: int
    """Decode steps the engine runs back to back per scheduler call (vLLM's
    multi-step scheduling, SGLang's continuous decode steps): the scheduler's
    host time is paid once per run, and a request that arrives (or a slot that
    frees) mid-run waits for the run to end before it is prefilled."""
    decode_steps_option: str | None
    """The engine's option that sets ``decode_steps`` (None: it has none)."""
    kernel_launch_s: float
    """Host cost of one kernel launch on the path this engine uses (graph replay
    or eager launches)."""
    eager_launch_s: float
    """Host cost of one kernel launched eagerly by an engine with CUDA graphs, in
    the steps its graphs do not cover (``graph_steps``); an engine without graphs
    launches every kernel at ``kernel_launch_s``, its eager cost."""
    kernels_per_layer: int
    """Kernels one transformer layer launches in a decode step."""
    attention_kernel: str
    decode_attention_hbm_efficiency: float
    """Fraction of HBM bandwidth the decode attention kernel reaches reading the KV cache."""
    decode_attention_sm_gb_per_s: tuple[tuple[str, float], ...]
    """(GPU generation, GB/s each SM sustains in that kernel): the bandwidth
    measured on a GPU of that generation over its SMs; a generation without one
    (the engine runs another kernel there, or none was measured) has no such
    bound. ``decode_attention_bytes_per_s`` bounds the kernel by it times a GPU's SMs."""
    quantisations: tuple[str, ...]
    pipeline_parallel: bool
    pipeline_layers: str
    """How its pipeline stages share the layers (``LAYER_SPLITS``)."""
    tensor_parallel_across_nodes: bool
    disaggregated_prefill: bool
    sources: dict
    """field -> its source, for reports."""
    feature_kernels: tuple[tuple[str, int], ...] = ()
    """Kernels a layer launches beyond ``kernels_per_layer`` for each feature of the
    model's layer that it has (``LAYER_FEATURES``), where the engine runs them as
    separate operators (eager, unfused); empty where its count covers them."""
    attention_score_bytes: float = 0.0
    """HBM bytes moved per attention score where the engine's attention is
    unfused (scores written by one kernel, masked, softmaxed and read by the next:
    ``latency.stage_seconds``); 0 for fused kernels (flash attention keeps the
    scores on chip), which is every engine file that does not set it."""
    kv_cache_tokens: int | None = None
    """The KV pool of one replica in tokens, as its user set it (vLLM
    ``--num-gpu-blocks-override`` x the block size, SGLang ``--max-total-tokens``,
    TensorRT-LLM ``KvCacheConfig.max_tokens``, LMDeploy ``cache_max_entry_count``
    blocks x ``cache_block_seq_len``); None: what ``kv_pool`` gives, else what
    memory leaves once the weights and activations are placed
    (``memory.kv_capacity_tokens``)."""
    kv_pool: KvPoolRule | None = None
    """How the engine sizes its KV pool from memory when its user did not set it
    (``KvPoolRule``); None: what memory leaves once the weights and activations
    are placed, less the allocator's fragmentation."""
    graph_steps: tuple[int, int, bool] | None = None
    """Which steps an engine with CUDA graphs replays as one: (largest decode
    batch below TP 4, from TP 4, whether steps that prefill are covered). A
    larger decode batch, or a step with prompt tokens where they are not
    covered, launches its kernels eagerly (``eager_launch_s``). None: every step
    replays a graph."""
    pipeline_split: PipelineSplit = PipelineSplit()
    """How a static batch is split into pipeline micro-batches (default: the
    planner chooses, for engines whose split is a setting or not published)."""
    gemm_allreduce_fusion: bool | None = None
    """The row-parallel GEMMs (attention output, MLP down) run fused with their
    tensor-parallel all-reduce, each tile reduced through the NVLink switch while
    the GEMM computes the next (TensorRT-LLM's ``gemm_allreduce_plugin``); None:
    the engine has no such kernel. Only on ``gemm_fusion_generations`` GPUs with
    the TP group inside one NVLink domain (``latency.stage_seconds``)."""
    gemm_fusion_generations: tuple[str, ...] = ()
    """GPU generations the fused GEMM + all-reduce kernel is built for."""
    allocator_fragmentation: float | None = None
    """Device memory per byte allocated by the engine's allocator (>= 1); None:
    megatron-core's PyTorch caching allocator (heuristics/memory.yaml), which
    the Python engines share."""
    fp8_context_fmha: bool | None = None
    """With FP8 weights and KV cache, the prompts' attention (context FMHA) runs on
    FP8 tensor cores (TensorRT-LLM ``--use_fp8_context_fmha``), on
    ``fp8_fmha_generations`` GPUs; None: the engine has no such kernel."""
    fp8_fmha_generations: tuple[str, ...] = ()
    """GPU generations the FP8 context FMHA runs on."""
    new_token_ratio: NewTokenRatio | None = None
    """Admission against the prompt plus an estimate of the outputs still to come
    (``NewTokenRatio``, SGLang); None: the engine admits by ``kv_reserves_output``."""
    kv_exact_admission: bool = False
    """A request is admitted only when every admitted request can still finish
    without an eviction, their output lengths known and the KV they free as they
    finish counted (SGLang's ``add_one_req_ignore_eos``, taken for requests sent
    with ``ignore_eos`` when the radix cache is disabled)."""
    moe_kernels: tuple[int, int, float] = (0, 0, 1.0)
    """(kernels an MoE layer launches beyond a dense one, kernels per local expert,
    host time of an expert's operator as a fraction of a dense layer's), where the
    engine runs the router, the dispatch and each expert's MLP as operators of
    their own (eager, one expert after another); (0, 0, 1) where its fused MoE
    kernels are counted as the dense MLP's."""

    @property
    def continuous(self) -> bool:
        return self.batching == "continuous"

    @property
    def kv_policy(self) -> str:
        """How requests are admitted against the KV cache (``KV_POLICIES``)."""
        if self.kv_reserves_output:
            return "reserve"
        if self.kv_exact_admission:
            return "exact"
        return "estimate" if self.new_token_ratio is not None else "preempt"

    @property
    def paged(self) -> bool:
        return self.kv_cache == "paged"

    def kernels_for(self, model) -> int:
        """Kernels one decode step launches per (dense) layer of ``model``."""
        features = layer_features(model)
        return self.kernels_per_layer + sum(n for f, n in self.feature_kernels if f in features)

    def moe_layer_kernels(self, model, local_experts):
        """Kernels one step launches per MoE layer of ``model`` with ``local_experts``
        experts on each GPU (arrays allowed), each expert's operators counted at
        their share of a dense operator's host time."""
        extra, per_expert, share = self.moe_kernels
        return self.kernels_for(model) + extra + per_expert * share * np.asarray(local_experts)

    def decode_attention_bytes_per_s(self, gpu) -> float:
        """Bytes/s the decode attention kernel reads the KV cache at on ``gpu``: its
        share of the datasheet bandwidth (``decode_attention_hbm_efficiency``), and
        on the generation it was measured on, no more than its measured per-SM rate
        times the GPU's SMs. Such a kernel
        streams at what its SMs keep in flight over the memory latency (Little's
        law), not at the bus's peak: FlashAttention-3's paged decode on an H100
        adds 1.9 TB/s at the margin from 2,000 to 4,000 cached tokens, 57% of the
        3.35 TB/s datasheet, so an H200, the same 132 SMs with 4.8 TB/s of HBM3e,
        is held near that rate rather than given 43% more; a Hopper H20 (78 SMs)
        reaches less. Our own H100 and H200 measurements of decode-sized GEMMs
        (``benchmarks/gpu/graph_gemm.csv``, M <= 64) run 1.11-1.17x faster on the
        H200 on average, not the 1.43x of its bandwidth."""
        share = gpu.hbm_bandwidth_gb_per_s * 1e9 * self.decode_attention_hbm_efficiency
        per_sm = dict(self.decode_attention_sm_gb_per_s).get(gpu.generation)
        return share if per_sm is None else min(share, per_sm * 1e9 * gpu.sm_count)

    def splits_layers(self, num_layers: int, pp: int) -> bool:
        """Whether the engine runs ``num_layers`` layers over ``pp`` pipeline
        stages (``pipeline_layers``)."""
        if pp == 1:
            return True
        if not self.pipeline_parallel or pp > num_layers:
            return False
        if self.pipeline_layers == "even":
            return num_layers % pp == 0
        if self.pipeline_layers == "ceil":
            return (pp - 1) * -(-num_layers // pp) < num_layers
        return True

    def graph_max_seqs(self, tp):
        """Largest decode batch replayed as a CUDA graph at TP ``tp`` (arrays
        allowed); 0 where the engine captures none, inf where graphs cover every batch."""
        tp = np.asarray(tp)
        if not self.cuda_graphs:
            return np.zeros(tp.shape)
        if self.graph_steps is None:
            return np.full(tp.shape, np.inf)
        below, from_tp4, _ = self.graph_steps
        return np.where(tp >= 4, float(from_tp4), float(below))

    def launch_s(self, tp, decode_seqs, prefill_tokens):
        """Host cost per kernel of a step with these loads (arrays broadcast): the
        graph path where the engine's graphs cover the step, else eager."""
        if not self.cuda_graphs:            # its one path: kernel_launch_s is the eager cost
            return np.full(np.broadcast(tp, decode_seqs, prefill_tokens).shape,
                           self.kernel_launch_s)
        covered = np.asarray(decode_seqs) <= self.graph_max_seqs(tp)
        if self.graph_steps is not None and not self.graph_steps[2]:
            covered = covered & (np.asarray(prefill_tokens) <= 0)
        return np.where(covered, self.kernel_launch_s, self.eager_launch_s)

    @property
    def decode_step_overhead_s(self) -> float:
        """Host time per decode-only step: a run of ``decode_steps`` shares one
        scheduler call (vLLM RFC #6854: the ~4 ms host bubble paid once per run)."""
        return self.step_overhead_s / self.decode_steps


LAYER_FEATURES = ("rope", "swiglu", "no_bias", "gqa")
"""Ways a layer differs from the GPT-3 layer that an engine's kernel count may
depend on: rotary embeddings, a gated MLP, no biases, fewer KV heads than heads."""


def layer_features(model) -> set[str]:
    return {name for name, has in (("rope", model.position_embedding == "rope"),
                                   ("swiglu", model.mlp_kind == "swiglu"),
                                   ("no_bias", not model.has_bias),
                                   ("gqa", model.num_kv_heads < model.num_heads)) if has}


def _feature_kernels(raw, path: Path) -> tuple[tuple[str, int], ...]:
    if not isinstance(raw, dict) or any(k not in LAYER_FEATURES or isinstance(v, bool)
                                        or not isinstance(v, int) for k, v in raw.items()):
        raise CatalogError(f"{path}: field 'feature_kernels_per_layer' needs integer counts "
                           f"keyed by {', '.join(LAYER_FEATURES)}")
    return tuple(sorted(raw.items()))


def engines_dir() -> Path:
    return heuristics_dir() / "engines"


def names() -> tuple[str, ...]:
    return tuple(sorted(p.stem for p in engines_dir().glob("*.yaml")))


def _value(data: dict, key: str, path: Path, sources: dict, kinds: tuple, optional=False):
    if key not in data:
        raise CatalogError(f"{path}: missing field {key!r}")
    value, source = sourced_field(data, key, path)
    sources[key] = source
    if value is None and optional:
        return None
    if isinstance(value, bool) and bool not in kinds:
        raise CatalogError(f"{path}: field {key!r} value {value!r} is not a number")
    if not isinstance(value, kinds):
        raise CatalogError(f"{path}: field {key!r} value {value!r} must be "
                           f"{' or '.join(k.__name__ for k in kinds)}")
    return value


def _per_generation(raw: dict, key: str, path: Path) -> tuple[tuple[str, float], ...]:
    """A mapping of GPU generation to a positive finite number, as sorted pairs."""
    if any(not isinstance(g, str) or isinstance(v, bool) or not isinstance(v, (int, float))
           or not 0 < v < float("inf") for g, v in raw.items()):
        raise CatalogError(f"{path}: field {key!r} needs a mapping of GPU generation to a "
                           "positive number (empty where none applies)")
    return tuple(sorted((g, float(v)) for g, v in raw.items()))


def _choice(value, allowed: tuple, key: str, path: Path) -> str:
    if value not in allowed:
        raise CatalogError(f"{path}: field {key!r} value {value!r}: allowed are "
                           f"{', '.join(allowed)}")
    return value


def _launch_s(raw, cuda_graphs: bool, path: Path) -> tuple[float, float]:
    """(per kernel on the engine's launch path, per kernel launched eagerly) from
    one number (both) or ``{eager: s, cuda_graph: s}``."""
    def checked(value) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise CatalogError(f"{path}: field 'kernel_launch_s' needs a non-negative number "
                               "(or eager/cuda_graph numbers)")
        return float(value)
    if not isinstance(raw, dict):
        return checked(raw), checked(raw)
    eager = checked(raw.get("eager"))
    graph = checked(raw.get("cuda_graph")) if cuda_graphs else eager
    return graph, eager


def _graph_steps(raw, path: Path) -> tuple[int, int, bool]:
    """The ``cuda_graph_steps`` mapping: ``max_decode_seqs`` and
    ``max_decode_seqs_from_tp4`` (positive integers) and ``prefill`` (bool)."""
    counts = (raw.get("max_decode_seqs"), raw.get("max_decode_seqs_from_tp4"))
    prefill = raw.get("prefill")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in counts) \
            or not isinstance(prefill, bool):
        raise CatalogError(f"{path}: field 'cuda_graph_steps' needs positive integers "
                           "'max_decode_seqs' and 'max_decode_seqs_from_tp4' and a boolean "
                           "'prefill'")
    return (*counts, prefill)


def _engine_data(path: Path, seen: tuple = ()) -> dict:
    """The engine file's mapping; with ``base: NAME`` the fields of that engine's
    file, then this file's (an older release described by what changed)."""
    data = load_yaml(path)
    base = data.get("base")
    if base is None:
        return data
    parent = engines_dir() / f"{base}.yaml"
    if not isinstance(base, str) or not parent.is_file() or base in seen:
        raise CatalogError(f"{path}: base {base!r} is not another engine file of "
                           f"{engines_dir()}")
    merged = {**_engine_data(parent, seen + (base,)), **data}
    merged.pop("base")
    return merged


@lru_cache(maxsize=None)
def _load(path_text: str) -> Engine:
    path = Path(path_text)
    data = _engine_data(path, (path.stem,))
    src: dict = {}
    num = (int, float)
    graphs = bool(_value(data, "cuda_graphs", path, src, (bool,)))
    allreduce = data.get("allreduce") or {}
    if not isinstance(allreduce, dict):
        raise CatalogError(f"{path}: 'allreduce' must be a mapping")
    launch, eager = _launch_s(_value(data, "kernel_launch_s", path, src, (int, float, dict)),
                              graphs, path)
    block = _value(data, "kv_block_tokens", path, src, (int,), optional=True)
    tokens = _value(data, "max_batched_tokens", path, src, (int,), optional=True)
    seqs = _value(data, "max_num_seqs", path, src, (int,), optional=True)
    step = _value(data, "step_overhead_s", path, src, num, optional=True)
    decode_steps = _value(data, "decode_steps", path, src, (int,))
    decode_option = _value(data, "decode_steps_option", path, src, (str,), optional=True)
    quant = _value(data, "quantisations", path, src, (list,))
    engine = Engine(
        name=str(data.get("name") or path.stem),
        display_name=str(data.get("display_name") or path.stem),
        version=str(_value(data, "version", path, src, (str, int, float))),
        batching=_choice(_value(data, "batching", path, src, (str,)), BATCHING, "batching",
                         path),
        kv_cache=_choice(_value(data, "kv_cache", path, src, (str,)), KV_CACHES, "kv_cache",
                         path),
        kv_block_tokens=block,
        chunked_prefill=bool(_value(data, "chunked_prefill", path, src, (bool,))),
        mixed_prefill=bool(_value(data, "mixed_prefill", path, src, (bool,))),
        prefill_samples_first_token=bool(
            _value(data, "prefill_samples_first_token", path, src, (bool,))),
        max_batched_tokens=tokens,
        max_num_seqs=seqs,
        kv_reserves_output=bool(_value(data, "kv_reserves_output", path, src, (bool,))),
        cuda_graphs=graphs,
        one_shot_max_bytes=_value(allreduce, "one_shot_max_bytes", path, src, num,
                                  optional=True),
        two_shot_max_bytes=_value(allreduce, "two_shot_max_bytes", path, src, num,
                                  optional=True),
        max_custom_tp=int(_value(allreduce, "max_custom_tp", path, src, (int,), optional=True)
                          or 1),
        step_overhead_s=float(step or 0.0),
        overlap_schedule=bool(_value(data, "overlap_schedule", path, src, (bool,))),
        decode_steps=int(decode_steps),
        decode_steps_option=decode_option,
        kernel_launch_s=launch,
        eager_launch_s=eager,
        kernels_per_layer=int(_value(data, "kernels_per_layer", path, src, (int,))),
        attention_kernel=str(_value(data, "attention_kernel", path, src, (str,))),
        decode_attention_hbm_efficiency=float(
            _value(data, "decode_attention_hbm_efficiency", path, src, num)),
        decode_attention_sm_gb_per_s=_per_generation(
            _value(data, "decode_attention_sm_gb_per_s", path, src, (dict,)),
            "decode_attention_sm_gb_per_s", path),
        quantisations=tuple(str(q) for q in quant),
        pipeline_parallel=bool(_value(data, "pipeline_parallel", path, src, (bool,))),
        pipeline_layers=_choice(_value(data, "pipeline_layers", path, src, (str,)),
                                LAYER_SPLITS, "pipeline_layers", path),
        tensor_parallel_across_nodes=bool(
            _value(data, "tensor_parallel_across_nodes", path, src, (bool,))),
        disaggregated_prefill=bool(_value(data, "disaggregated_prefill", path, src, (bool,))),
        feature_kernels=_feature_kernels(
            _value(data, "feature_kernels_per_layer", path, src, (dict,)), path)
        if "feature_kernels_per_layer" in data else (),
        # Absent: fused attention, scores kept on chip (every engine but the worker's path).
        attention_score_bytes=float(_value(data, "attention_score_bytes", path, src, num))
        if "attention_score_bytes" in data else 0.0,
        kv_pool=_kv_pool(_value(data, "kv_pool_memory", path, src, (dict,)), path)
        if "kv_pool_memory" in data else None,
        graph_steps=_graph_steps(_value(data, "cuda_graph_steps", path, src, (dict,)), path)
        if "cuda_graph_steps" in data else None,
        moe_kernels=_moe_kernels(_value(data, "moe_kernels_per_layer", path, src, (dict,)),
                                 path) if "moe_kernels_per_layer" in data else (0, 0, 1.0),
        pipeline_split=_pipeline_split(_value(data, "pipeline_split", path, src, (dict,)), path)
        if "pipeline_split" in data else PipelineSplit(),
        gemm_allreduce_fusion=bool(_value(allreduce, "gemm_fusion", path, src, (bool,)))
        if "gemm_fusion" in allreduce else None,
        gemm_fusion_generations=tuple(str(g) for g in _value(
            allreduce, "gemm_fusion_generations", path, src, (list,)))
        if "gemm_fusion" in allreduce else (),
        fp8_context_fmha=bool(_value(data, "fp8_context_fmha", path, src, (bool,)))
        if "fp8_context_fmha" in data else None,
        fp8_fmha_generations=tuple(str(g) for g in _value(
            data, "fp8_context_fmha_generations", path, src, (list,)))
        if "fp8_context_fmha" in data else (),
        new_token_ratio=_new_token_ratio(_value(data, "new_token_ratio", path, src, (dict,)),
                                         path) if "new_token_ratio" in data else None,
        allocator_fragmentation=float(_value(data, "allocator_fragmentation", path, src, num))
        if "allocator_fragmentation" in data else None,
        sources=src)
    if engine.paged and not engine.kv_block_tokens:
        raise CatalogError(f"{path}: a paged KV cache needs kv_block_tokens")
    if engine.graph_steps is not None and not engine.cuda_graphs:
        raise CatalogError(f"{path}: cuda_graph_steps needs cuda_graphs true")
    if engine.kv_pool is not None and engine.kv_pool.reserve and engine.graph_steps is None \
            and engine.cuda_graphs:
        raise CatalogError(f"{path}: a kv_pool_memory reserve counts the graphs' batch: "
                           "give cuda_graph_steps")
    if engine.allocator_fragmentation is not None \
            and not 1.0 <= engine.allocator_fragmentation <= 2.0:
        raise CatalogError(f"{path}: allocator_fragmentation must be in [1, 2]")
    if not 0 < engine.decode_attention_hbm_efficiency <= 1:
        raise CatalogError(f"{path}: decode_attention_hbm_efficiency must be in (0, 1]")
    if engine.decode_steps < 1 or (engine.decode_steps > 1 and not engine.decode_steps_option):
        raise CatalogError(f"{path}: decode_steps must be 1, or more with a decode_steps_option")
    return engine


def _pipeline_split(raw: dict, path: Path) -> PipelineSplit:
    """The ``pipeline_split`` mapping: ``decode`` and ``prefill`` rules, and
    ``prefill_max_tokens`` (a positive integer) exactly where the prefill is ``per_stage``."""
    unknown = set(raw) - {"decode", "prefill", "prefill_max_tokens", "decode_overlaps_steps"}
    decode, prefill = raw.get("decode", "chosen"), raw.get("prefill", "chosen")
    limit = raw.get("prefill_max_tokens")
    overlaps = raw.get("decode_overlaps_steps", True)
    if unknown or decode not in DECODE_SPLITS or prefill not in PREFILL_SPLITS \
            or not isinstance(overlaps, bool) \
            or (prefill == "per_stage") != (limit is not None) \
            or (limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                       or limit < 1)):
        raise CatalogError(f"{path}: field 'pipeline_split' needs decode "
                           f"({', '.join(DECODE_SPLITS)}), prefill "
                           f"({', '.join(PREFILL_SPLITS)}) and, for a per_stage prefill, a "
                           "positive integer prefill_max_tokens, and optionally "
                           "decode_overlaps_steps (true or false)")
    return PipelineSplit(decode, prefill, limit, overlaps)


def _moe_kernels(raw: dict, path: Path) -> tuple[int, int, float]:
    """The ``moe_kernels_per_layer`` mapping: ``extra`` and ``per_local_expert``,
    non-negative integers, and ``expert_op_host_fraction`` in (0, 1]."""
    counts = tuple(raw.get(k) for k in ("extra", "per_local_expert"))
    share = raw.get("expert_op_host_fraction")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in counts) \
            or isinstance(share, bool) or not isinstance(share, (int, float)) \
            or not 0 < share <= 1:
        raise CatalogError(f"{path}: field 'moe_kernels_per_layer' needs non-negative integer "
                           "counts 'extra' and 'per_local_expert' and an "
                           "'expert_op_host_fraction' in (0, 1]")
    return (*counts, float(share))


def _kv_pool(data: dict, path: Path) -> KvPoolRule:
    """The ``kv_pool_memory`` mapping: ``of`` one of ``KV_POOL_BASES`` and either a
    ``share`` in (0, 1] or a ``reserve`` mapping of every ``RESERVE_TERMS``."""
    of, share, reserve = data.get("of"), data.get("share"), data.get("reserve")
    number = (int, float)
    bad_reserve = reserve is not None and (
        not isinstance(reserve, dict) or set(reserve) != set(RESERVE_TERMS)
        or not all(isinstance(v, number) and v >= 0 for v in reserve.values()))
    if of not in KV_POOL_BASES or (share is None) == (reserve is None) or bad_reserve \
            or (share is not None and (not isinstance(share, number) or not 0 < share <= 1)):
        raise CatalogError(f"{path}: kv_pool_memory must give 'of' ({', '.join(KV_POOL_BASES)}) "
                           "and either a 'share' in (0, 1] or a 'reserve' with "
                           f"{', '.join(RESERVE_TERMS)} (numbers >= 0)")
    return KvPoolRule(str(of), None if share is None else float(share),
                      tuple(sorted((k, float(v)) for k, v in (reserve or {}).items())))


def _new_token_ratio(data: dict, path: Path) -> NewTokenRatio:
    """The ``new_token_ratio`` mapping: ``initial`` and ``minimum_factor`` (the
    minimum as a share of the initial ratio) in (0, 1], whole ``decay_steps``,
    ``retract_steps`` and ``clip_tokens`` >= 1."""
    keys = ("initial", "minimum_factor", "decay_steps", "retract_steps", "clip_tokens")
    ok = set(data) == set(keys) and all(
        isinstance(data[k], (int, float)) and not isinstance(data[k], bool) for k in keys)
    ok = ok and 0 < data["initial"] <= 1 and 0 < data["minimum_factor"] <= 1 and all(
        isinstance(data[k], int) and data[k] >= 1 for k in keys[2:])
    if not ok:
        raise CatalogError(f"{path}: new_token_ratio must give initial and minimum_factor in "
                           "(0, 1] and whole decay_steps, retract_steps and clip_tokens >= 1")
    initial = float(data["initial"])
    return NewTokenRatio(initial, initial * float(data["minimum_factor"]),
                         int(data["decay_steps"]), int(data["retract_steps"]),
                         int(data["clip_tokens"]))


def _count(flag: str, value, top: int) -> int:
    """``value`` as an integer from 1 to ``top``; one-line InputError naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or not 1 <= value <= top:
        raise InputError(f"invalid {flag} {shown(value)}: must be an integer from 1 to {top}")
    return int(value)


def with_decode_steps(engine: Engine, steps: int | None) -> Engine:
    """``engine`` run with ``steps`` decode steps per scheduler call (None: its
    default); one-line InputError where the engine has no such option."""
    if steps is None or steps == engine.decode_steps:
        return engine
    steps = _count("--decode-steps", steps, MAX_DECODE_STEPS)
    if not engine.decode_steps_option:
        able = ", ".join(n for n in names() if get_engine(n).decode_steps_option)
        raise InputError(f"invalid --decode-steps {steps}: engine {engine.name} runs one decode "
                         f"step per scheduler call; engines with multi-step decoding: {able}")
    return dataclasses.replace(engine, decode_steps=steps)


def _switched(engine: Engine, field: str, on: bool | None, refusal: str) -> Engine:
    """``engine`` with the in-flight setting ``field`` (its ``--field/--no-field``
    flag) on or off (None: its default); one-line InputError, saying ``refusal``,
    for an engine that serves static batches."""
    if on is None or on == getattr(engine, field):
        return engine
    if not engine.continuous:
        flag = "--" + ("" if on else "no-") + field.replace("_", "-")
        raise InputError(f"invalid {flag}: engine {engine.name} serves static batches, "
                         f"{refusal}")
    return dataclasses.replace(engine, **{field: bool(on)})


def with_mixed_prefill(engine: Engine, mixed: bool | None) -> Engine:
    """``engine`` with prefill mixed into decode steps or not (None: its default);
    one-line InputError for an engine that serves static batches."""
    return _switched(engine, "mixed_prefill", mixed, "each prefilled, then decoded; "
                     "mixing applies to in-flight engines")


def with_overlap_schedule(engine: Engine, overlap: bool | None) -> Engine:
    """``engine`` scheduling one step ahead of the GPU or not (None: its default;
    SGLang ``--disable-overlap-schedule``, TensorRT-LLM ``disable_overlap_scheduler``,
    vLLM ``--async-scheduling``); one-line InputError for a static engine."""
    return _switched(engine, "overlap_schedule", overlap,
                     "with no scheduler admitting requests between steps")


def _with_kernel(engine: Engine, field: str, on: bool | None, flag: str, kernel: str) -> Engine:
    """``engine`` with its optional kernel ``field`` switched ``on`` or off (None:
    its default); one-line InputError naming ``--[no-]flag`` where the engine has
    no such kernel (the field is None)."""
    if on is None or on == getattr(engine, field):
        return engine
    if getattr(engine, field) is None:
        raise InputError(f"invalid --{'' if on else 'no-'}{flag}: engine {engine.name} has no "
                         f"{kernel}")
    return dataclasses.replace(engine, **{field: bool(on)})


def with_gemm_allreduce_fusion(engine: Engine, fused: bool | None) -> Engine:
    """``engine`` with its row-parallel GEMMs fused with their all-reduce or not
    (None: its default; TensorRT-LLM ``trtllm-build --gemm_allreduce_plugin``)."""
    return _with_kernel(engine, "gemm_allreduce_fusion", fused, "gemm-allreduce-fusion",
                        "fused GEMM + all-reduce kernel (TensorRT-LLM's gemm_allreduce_plugin)")


def with_fp8_context_fmha(engine: Engine, fp8: bool | None) -> Engine:
    """``engine`` running its prompts' attention in FP8 or not (None: its default;
    TensorRT-LLM ``trtllm-build --use_fp8_context_fmha``)."""
    return _with_kernel(engine, "fp8_context_fmha", fp8, "fp8-context-fmha",
                        "FP8 context attention kernel (TensorRT-LLM's use_fp8_context_fmha)")


def fp8_prompt_attention(engine: Engine, precision: str, generation: str) -> bool:
    """Whether a prompt's attention runs in FP8: the engine's FP8 context FMHA is
    on, the KV cache is FP8 (``--precision fp8``, and nvfp4's FP8 cache) and the
    GPU generation has the kernel."""
    return bool(engine.fp8_context_fmha) and precision in ("fp8", "nvfp4") \
        and generation in engine.fp8_fmha_generations


def with_chunked_prefill(engine: Engine, chunked: bool | None) -> Engine:
    """``engine`` with prompts split to fill each step's token budget or run whole
    (None: its default; TensorRT-LLM ``enable_chunked_context``, vLLM
    ``--enable-chunked-prefill``); one-line InputError for an engine that serves
    static batches."""
    return _switched(engine, "chunked_prefill", chunked,
                     "whose prompts run whole; chunking applies to in-flight engines")


KV_POLICIES = ("reserve", "preempt", "estimate", "exact")
"""How an in-flight engine admits requests against its KV cache: ``reserve``, only
when the cache holds the prompt and the whole output (TensorRT-LLM
GUARANTEED_NO_EVICT); ``preempt``, against the prompt alone, the cache growing a
token per decode and the newest request evicted and recomputed when it is full
(vLLM; TensorRT-LLM MAX_UTILIZATION); ``estimate``, against the prompt and a
decaying share of the outputs still to come, retracting when the cache runs out
(SGLang's default, ``NewTokenRatio``; engines that have it); ``exact``, only when
every admitted request can still finish without an eviction, the KV freed by
those finishing first counted (SGLang for requests sent with ``ignore_eos`` and
the radix cache disabled, as its serving benchmark does)."""


def with_kv_policy(engine: Engine, policy: str | None) -> Engine:
    """``engine`` admitting requests by ``policy`` (``KV_POLICIES``; None: its
    default); one-line InputError for another value or a static engine."""
    if policy is None:
        return engine
    if policy not in KV_POLICIES:
        raise InputError(f"invalid --kv-policy {policy!r}: allowed are "
                         f"{', '.join(KV_POLICIES)}")
    if not engine.continuous:
        raise InputError(f"invalid --kv-policy {policy}: engine {engine.name} serves static "
                         "batches, each holding its whole cache; admission applies to "
                         "in-flight engines")
    if policy == "estimate" and engine.new_token_ratio is None:
        raise InputError(f"invalid --kv-policy estimate: engine {engine.name} has no "
                         "estimate of the outputs to come (SGLang's new_token_ratio); allowed "
                         "are reserve, preempt, exact")
    return dataclasses.replace(
        engine, kv_reserves_output=policy == "reserve", kv_exact_admission=policy == "exact",
        new_token_ratio=engine.new_token_ratio if policy == "estimate" else None)


def with_max_batched_tokens(engine: Engine, tokens: int | None) -> Engine:
    """``engine`` with a token budget per step of ``tokens`` (None: its default;
    vLLM ``--max-num-batched-tokens``, TensorRT-LLM ``max_num_tokens``, SGLang
    ``--chunked-prefill-size``); one-line InputError for a bad value or a static engine."""
    if tokens is None or tokens == engine.max_batched_tokens:
        return engine
    return _with_count(engine, "--max-batched-tokens", "max_batched_tokens", tokens,
                       MAX_BATCHED_TOKENS, engine.continuous,
                       "serves static batches, with no token budget per step")


def with_kv_cache_tokens(engine: Engine, tokens: int | None) -> Engine:
    """``engine`` with a KV pool of ``tokens`` per replica (None: sized from memory);
    one-line InputError for a bad value or an engine without a paged pool."""
    if tokens is None:
        return engine
    return _with_count(engine, "--kv-cache-tokens", "kv_cache_tokens", tokens,
                       MAX_KV_CACHE_TOKENS, engine.paged,
                       "keeps a contiguous KV cache per sequence, with no pool to size")


def with_kv_memory_fraction(engine: Engine, fraction: float | None) -> Engine:
    """``engine`` holding its KV memory rule to ``fraction`` (None: its default):
    TensorRT-LLM ``free_gpu_memory_fraction``, vLLM ``--gpu-memory-utilization``,
    SGLang ``--mem-fraction-static`` (``KvPoolRule``); one-line InputError for a
    value outside (0, 1] or an engine without such a setting."""
    if fraction is None:
        return engine
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) \
            or not 0 < fraction <= 1:
        raise InputError(f"invalid --kv-memory-fraction {shown(fraction)}: must be a number "
                         "in (0, 1]")
    if engine.kv_pool is None:
        able = ", ".join(n for n in names() if get_engine(n).kv_pool is not None)
        raise InputError(f"invalid --kv-memory-fraction {fraction:g}: engine {engine.name} "
                         f"has no memory share setting for its KV cache (engines with one: "
                         f"{able}); --kv-cache-tokens sets its pool")
    return dataclasses.replace(engine, kv_pool=dataclasses.replace(
        engine.kv_pool, share=float(fraction), reserve=()))


MAX_GRAPH_SEQS = 1 << 16
"""Largest --cuda-graph-max-batch accepted (SGLang's capture list ends far below)."""


def with_cuda_graph_max_batch(engine: Engine, seqs: int | None) -> Engine:
    """``engine`` replaying decode batches up to ``seqs`` as CUDA graphs at every
    TP (None: its default; SGLang ``--cuda-graph-max-bs``); one-line InputError
    for a bad value or an engine whose graph coverage is not modelled by batch."""
    if seqs is None:
        return engine
    seqs = _count("--cuda-graph-max-batch", seqs, MAX_GRAPH_SEQS)
    if engine.graph_steps is None:
        able = ", ".join(n for n in names() if get_engine(n).graph_steps is not None)
        raise InputError(f"invalid --cuda-graph-max-batch {seqs}: engine {engine.name} "
                         + ("runs no CUDA graphs" if not engine.cuda_graphs
                            else "is modelled with graphs for every step")
                         + f"; engines with a decode graph batch: {able}")
    return dataclasses.replace(engine, graph_steps=(seqs, seqs, engine.graph_steps[2]))


def configured(name: str, decode_steps: int | None = None, mixed_prefill: bool | None = None,
               chunked_prefill: bool | None = None, max_batched_tokens: int | None = None,
               kv_cache_tokens: int | None = None, kv_policy: str | None = None,
               kv_memory_fraction: float | None = None,
               overlap_schedule: bool | None = None,
               cuda_graph_max_batch: int | None = None,
               gemm_allreduce_fusion: bool | None = None,
               fp8_context_fmha: bool | None = None) -> Engine:
    """Engine ``name`` with the settings a user gives ``infer`` (None: the engine's
    default), checked in one order so the CLI and ``infer-validate`` agree."""
    engine = with_mixed_prefill(with_decode_steps(get_engine(name), decode_steps), mixed_prefill)
    engine = with_cuda_graph_max_batch(engine, cuda_graph_max_batch)
    engine = with_overlap_schedule(engine, overlap_schedule)
    engine = with_chunked_prefill(engine, chunked_prefill)
    engine = with_max_batched_tokens(engine, max_batched_tokens)
    engine = with_kv_policy(with_kv_cache_tokens(engine, kv_cache_tokens), kv_policy)
    engine = with_gemm_allreduce_fusion(engine, gemm_allreduce_fusion)
    engine = with_fp8_context_fmha(engine, fp8_context_fmha)
    return with_kv_memory_fraction(engine, kv_memory_fraction)


def _with_count(engine: Engine, flag: str, field: str, value, top: int, applies: bool,
                refusal: str) -> Engine:
    """``engine`` with ``field`` set to ``value`` checked as ``flag`` (1 to ``top``);
    where the setting does not ``applies`` to the engine, InputError saying ``refusal``."""
    value = _count(flag, value, top)
    if not applies:
        raise InputError(f"invalid {flag} {value}: engine {engine.name} {refusal}")
    return dataclasses.replace(engine, **{field: value})


def get_engine(name: str | None) -> Engine:
    """The engine ``name`` (default ``DEFAULT_ENGINE``); InputError naming the choices."""
    name = name or DEFAULT_ENGINE
    path = engines_dir() / f"{name}.yaml"
    if not name.replace("-", "").replace("_", "").replace(".", "").isalnum() \
            or not path.is_file():
        raise InputError(f"unknown engine {name!r}: allowed are {', '.join(names())}")
    return _load(str(path))


def check_precision(engine: Engine, precision: str) -> None:
    """fp8 or nvfp4 serving needs the engine to quantise weights that way
    (one-line InputError)."""
    if precision in ("fp8", "nvfp4") and not any(precision in q for q in engine.quantisations):
        raise InputError(f"engine {engine.name} does not serve {precision} weights: use "
                         f"--precision bf16 or one of the engines that do")
