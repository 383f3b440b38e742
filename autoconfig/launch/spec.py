"""The one description of a run that every launch target renders.

``LaunchSpec`` is built once from a search result (the model, workload, plan,
cluster and software stack the prediction assumed) and the base config (LR,
schedule, init, token budget); megatron_lm.py, sbatch.py, bridge.py and
nemo1.py only format it, so they cannot disagree with each other or with the
prediction. Everything derived (samples, iterations, vocabulary padding, the
FP8 recipe) is computed here, once.
"""

import math
from dataclasses import dataclass
from functools import lru_cache

from autoconfig.base.config import BaseConfig, base_for_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import (Plan, Workload, counts_embedding_and_loss,
                                  is_short_last_layout, stage_layers)
from autoconfig.errors import CatalogError
from autoconfig.heuristics import load_heuristics
from autoconfig.core.catalog import published_schedule
from autoconfig.launch.encdec import family_tokenizer
from autoconfig.launch.moe import MoeLaunch, MoeRouter, moe_launch
from autoconfig.training.context_parallel import a2a_group_size
from autoconfig.training.fp8 import workload_recipe
from autoconfig.training.stack import (DEFAULT_STACK, LAUNCHED_FRAMEWORK, SoftwareFeatures,
                                       grad_reduce_dtype, load_stack)
from autoconfig.yamlio import sourced_field

MAX_VOCAB_DIVISOR = 1024
"""Largest --make-vocab-size-divisible-by tried (Megatron's default is 128)."""


MEGATRON_FUSED_LOSSES = ("native", "te")
"""The cross entropies (``SoftwareFeatures.cross_entropy``) megatron-core runs fused:
its --cross-entropy-fusion-impl choices (with --cross-entropy-loss-fusion)."""

@dataclass(frozen=True)
class FamilyLaunch:
    """What a launch needs about a model family beyond its shape (heuristics/launch.yaml)."""

    tokenizer_type: str
    """Megatron-LM --tokenizer-type."""
    tokenizer_model: str
    """Hugging Face tokenizer name (HuggingFaceTokenizer) or the vocabulary's origin."""
    tokenizer_vocab_size: int
    """Tokens of the real tokenizer, before Megatron pads it."""
    rotary_base: int
    bridge_recipe: str
    """``module:function`` of the Megatron-Bridge recipe the NeMo 2 file starts from."""
    placeholder: bool = False
    """True when the family is unknown: NullTokenizer with the plan's vocabulary."""
    recipe_builds_model: bool = False
    """The recipe builds exactly this model from its Hugging Face config (launch.yaml
    ``moe_recipes``): bridge_recipe.py keeps the recipe's architecture (activation,
    positions, norms, router) and sets shape, plan, stack and schedule."""
    router: MoeRouter = MoeRouter()
    """MoE routing and load balancing (launch.yaml ``moe_router``); unused when dense."""


@dataclass(frozen=True)
class SlurmSettings:
    """Where and how long the job runs (the same options as profiling's)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit_min: int | None = None
    container_image: str | None = None
    """pyxis --container-image; None runs on the host."""
    job_name: str = "autoconfig"
    request_gpus: bool = True
    """Emit #SBATCH --gpus-per-node (off only for CPU test clusters without GRES)."""


@dataclass(frozen=True)
class LaunchSpec:
    """Model, hyper-parameters, plan, workload, software and cluster of one run."""

    model: ModelSpec
    base: BaseConfig
    """LR, schedule, optimizer, init and token budget."""
    base_source: str
    """Where ``base`` came from: a base.yaml path or autoconfig base's defaults."""
    plan: Plan
    workload: Workload
    software: SoftwareFeatures
    """Exactly the features the prediction assumed."""
    stack: str
    cluster: Cluster
    family: FamilyLaunch
    slurm: SlurmSettings = SlurmSettings()

    # ---------------------------------------------------------- schedule
    @property
    def train_samples(self) -> int:
        """Sequences to train on: the base config's steps at its own batch."""
        return self.base.train_steps * self.base.global_batch_size

    @property
    def warmup_samples(self) -> int:
        return self.base.lr_warmup_steps * self.base.global_batch_size

    @property
    def decay_samples(self) -> int:
        return self.base.lr_decay_steps * self.base.global_batch_size

    def iterations(self, samples: int) -> int:
        """Optimizer steps at the plan's global batch (NeMo and Bridge count steps)."""
        return math.ceil(samples / self.workload.global_batch_size)

    @property
    def train_iters(self) -> int:
        return self.iterations(self.train_samples)

    @property
    def warmup_iters(self) -> int:
        return self.iterations(self.warmup_samples)

    @property
    def decay_iters(self) -> int:
        return self.iterations(self.decay_samples)

    @property
    def cuda_graph(self) -> tuple[str, list[str]] | None:
        """(``--cuda-graph-impl``, ``--cuda-graph-scope`` list) of the stack's
        ``cuda_graph`` (megatron-core 0.16: whole iterations only with the local
        implementation, scopes only with Transformer Engine's); None: no graphs."""
        if self.software.cuda_graph == "full-iteration":
            return None if self.cuda_graph_off else ("local", ["full_iteration"])
        if self.software.cuda_graph == "te-scoped":
            return "transformer_engine", ["attn"] + (
                ["moe_router", "moe_preprocess"] if self.moe is not None else [])
        return None

    @property
    def cp_comm(self) -> tuple[str, list[int] | None] | None:
        """(``--cp-comm-type``, ``--hierarchical-context-parallel-sizes`` or None)
        of the stack's context-parallel scheme, None for megatron-core's default
        p2p or without CP. a2a+p2p names its all-to-all group first, as the
        prediction sized it (``context_parallel.a2a_group_size``)."""
        comm, cp = self.software.cp_comm_type, self.plan.cp
        if cp <= 1 or comm == "p2p":
            return None
        if comm != "a2a+p2p":
            return comm, None
        a2a = int(a2a_group_size(comm, self.model, self.plan.tp, cp,
                                 self.cluster.nvlink_domain_gpus))
        return comm, [a2a, cp // a2a]

    @property
    def cuda_graph_off(self) -> str | None:
        """Why the stack's whole-iteration graph is not launched, or None:
        megatron-core 0.16 refuses local graphs beside EP A2A overlap
        (TransformerConfig: "CUDA graph scope on moe and mlp is not supported
        with overlap_moe_expert_parallel_comm"); the prediction assumed both,
        as newer Megatron-Bridge releases run them."""
        if self.software.cuda_graph == "full-iteration" and self.moe is not None \
                and self.moe.a2a_overlap:
            return ("whole-iteration CUDA graphs left off: megatron-core 0.16 refuses them "
                    "with EP A2A overlap (the prediction assumed both)")
        return None

    # ---------------------------------------------------------- model
    @property
    def vocab_divisor(self) -> int:
        """--make-vocab-size-divisible-by that pads the tokenizer to the plan's vocabulary."""
        return vocab_divisor(self.family.tokenizer_vocab_size, self.model.vocab_size, self.plan.tp)

    @property
    def padded_vocab(self) -> int:
        """What Megatron pads the tokenizer to (tokenizer.py _vocab_size_with_padding)."""
        multiple = self.vocab_divisor * self.plan.tp
        return math.ceil(self.family.tokenizer_vocab_size / multiple) * multiple

    @property
    def stage_layers(self) -> tuple[int, ...]:
        return stage_layers(self.model.num_layers, self.plan)

    @property
    def pipeline_layout(self) -> str | None:
        """Megatron's --pipeline-model-parallel-layout for a short-last-stage split
        (``autoconfig.core.plan.short_last_stage_split``) run with virtual stages,
        which --decoder-last-pipeline-num-layers cannot express (it
        needs the last stage's layers divisible by vp, TransformerConfig
        ``__post_init__`` "Uneven PP"): every model chunk c layers, the last one r
        plus the MTP modules and the loss, the way Bridge writes DeepSeek-V3's
        PP 4 VP 4 (``Et*4|(t*4|)*14tmL``). None otherwise."""
        p, m = self.plan, self.model
        if p.pp < 2 or p.vp < 2 or p.first_stage_layers or not p.last_stage_layers:
            return None
        if not bool(is_short_last_layout(m.num_layers, p.pp, p.vp, 0, p.last_stage_layers)):
            return None
        chunk = (m.num_layers - p.last_stage_layers) // ((p.pp - 1) * p.vp)
        rest = p.last_stage_layers - (p.vp - 1) * chunk
        stages = p.pp * p.vp
        middle = f"(t*{chunk}|)*{stages - 2}" if stages > 2 else ""
        last = ("t" if rest == 1 else f"t*{rest}") + "m" * m.mtp_layers + "L"
        return f"Et*{chunk}|{middle}{last}"

    @property
    def embedding_and_loss_split(self) -> bool:
        """The plan's split is the one that counts the embedding and the loss as one
        layer each (Megatron --account-for-embedding/loss-in-pipeline-split)."""
        p = self.plan
        return bool(p.first_stage_layers and p.last_stage_layers and counts_embedding_and_loss(
            self.model.num_layers, p.pp, p.first_stage_layers, p.last_stage_layers))

    @property
    def recompute_num_layers(self) -> int:
        """Megatron --recompute-num-layers: the plan's 0 (every layer) is 1 per group
        for uniform and, for block, every layer of the largest model chunk (Megatron
        counts block recompute per chunk: a stage's layers / VP)."""
        plan = self.plan
        if plan.recompute_num_layers:
            return plan.recompute_num_layers
        if plan.recompute_method == "uniform":
            return 1
        if self.model.is_encoder_decoder:
            # megatron-core's T5 encoder and decoder are two blocks, each applying it
            return max(self.model.encoder_layers, self.model.decoder_layers)
        return math.ceil(max(self.stage_layers) / plan.vp)

    @property
    def fp8_recipe(self) -> str | None:
        """Megatron-LM --fp8-recipe: the stack's (or --fp8-recipe's), else what the
        recipes run on the GPU generation (None for bf16)."""
        return workload_recipe(self.workload, self.software, self.cluster.gpu)

    @property
    def fp8_format(self) -> str | None:
        """hybrid (E4M3 forward, E5M2 gradients) for tensorwise scaling; MXFP8 is E4M3."""
        recipe = self.fp8_recipe
        return None if recipe is None else ("e4m3" if recipe == "mxfp8" else "hybrid")

    @property
    def grad_reduce_dtype(self) -> str:
        return grad_reduce_dtype(self.software)

    @property
    def cross_entropy_fusion_impl(self) -> str | None:
        """megatron-core's --cross-entropy-fusion-impl of the stack's fused loss
        (``MEGATRON_FUSED_LOSSES``); None for the unfused default."""
        kind = self.software.cross_entropy
        return kind if kind in MEGATRON_FUSED_LOSSES else None

    @property
    def overlap_param_gather(self) -> bool:
        """Megatron allows it only with the distributed optimizer and overlapped grad reduce."""
        return (self.software.overlap_param_gather and self.software.overlap_grad_reduce
                and self.plan.distributed_optimizer)

    @property
    def tp_comm_overlap(self) -> bool:
        """Userbuffers overlap needs TP > 1 with sequence parallelism, and one
        sequence length (not T5's: ``tp_comm_overlap_off``)."""
        return self._tp_comm_overlap_asked and not self.model.is_encoder_decoder

    @property
    def _tp_comm_overlap_asked(self) -> bool:
        return self.software.tp_comm_overlap and self.plan.tp > 1 and self.plan.sp

    @property
    def tp_comm_overlap_off(self) -> str | None:
        """Why the stack's TP communication overlap is left off for this model (None: it is
        not): Megatron-LM sizes the userbuffers for one sequence (seq_length x micro-batch,
        megatron/training/initialize.py _initialize_tp_communicators, core_v0.16.1), and a
        T5 decoder's GEMMs run over the decoder's shorter sequence."""
        if not (self._tp_comm_overlap_asked and self.model.is_encoder_decoder):
            return None
        return ("TP communication overlap off: the userbuffers are sized for one sequence "
                f"length, and T5's encoder ({self.workload.seq_len} tokens) and decoder "
                f"({self.model.decoder_seq_len}) differ")

    @property
    def launchable(self) -> bool:
        """The launch targets (Megatron-LM, Megatron-Bridge, NeMo) run megatron-core;
        a plan predicted for another framework gets none."""
        return self.software.launchable

    @property
    def not_launchable_reason(self) -> str:
        return (f"no launch files: the plan was predicted for stack {self.stack} "
                f"({self.software.framework}), and autoconfig writes Megatron-LM, "
                f"Megatron-Bridge and NeMo launches, which run {LAUNCHED_FRAMEWORK}")

    @property
    def interleaved(self) -> bool:
        """The interleaved 1F1B schedule (PP > 1 with VP > 1)."""
        return self.plan.pp > 1 and self.plan.vp > 1

    @property
    def overlap_p2p_comm(self) -> bool:
        """Pipeline sends overlapped with compute: only the interleaved schedule can."""
        return self.software.overlap_p2p_comm and self.interleaved

    @property
    def attention_backend(self) -> str:
        """Megatron-LM --attention-backend for the attention the prediction assumed."""
        if not self.software.flash_attention:
            return "unfused"
        return "flash" if self.software.attention_kernel == "llm-foundry" else "fused"

    @property
    def moe(self) -> MoeLaunch | None:
        """Experts, expert parallelism and dispatch (None for a dense model)."""
        return moe_launch(self.model, self.plan, self.software, self.family.router)

    def describe(self) -> list[str]:
        """Comment lines shared by every target's header."""
        m, c = self.model, self.cluster
        lines = [f"autoconfig: {m.name} on {c.nodes} x {c.gpus_per_node} {c.gpu.name}, "
                 f"stack {self.stack}",
                 f"hyper-parameters: {self.base_source}",
                 f"schedule: {self.train_samples} samples ({self.base.tokens:.4g} tokens), "
                 f"lr {self.base.lr:.4g} -> {self.base.min_lr:.4g} {self.base.lr_decay_style}, "
                 f"warm-up {self.warmup_samples} samples, decay {self.decay_samples} samples"]
        lines += [self.tp_comm_overlap_off] if self.tp_comm_overlap_off else []
        lines += [self.cuda_graph_off] if self.cuda_graph_off else []
        return lines + ([self.moe.describe()] if self.moe else [])


def vocab_divisor(tokenizer_vocab: int, plan_vocab: int, tp: int) -> int:
    """The largest power of two d (<= MAX_VOCAB_DIVISOR) for which Megatron pads
    ``tokenizer_vocab`` to exactly ``plan_vocab`` (a multiple of d * tp); 1 when none
    does (then the padded vocabulary differs from the plan's, and the header says so)."""
    d = MAX_VOCAB_DIVISOR
    while d >= 1:
        multiple = d * tp
        if math.ceil(tokenizer_vocab / multiple) * multiple == plan_vocab:
            return d
        d //= 2
    return 1


@lru_cache(maxsize=1)
def _launch_data() -> dict:
    return load_heuristics("launch")


def family_launch(model: ModelSpec) -> FamilyLaunch:
    """The family's tokenizer, RoPE base, recipe and MoE router; a NullTokenizer
    placeholder with the plan's vocabulary for families not in heuristics/launch.yaml."""
    data = _launch_data()
    where = "heuristics/launch.yaml"
    entry = (data.get("families") or {}).get(model.family)
    recipe, builds = _bridge_recipe(model, data, entry)
    router = _router(model, data)
    if model.is_encoder_decoder:
        # T5's data pipeline needs a tokenizer with sentinels (no NullTokenizer); no
        # Bridge recipe runs T5, so the recipe is never written (bridge.py); RoPE base:
        # Megatron's default (the catalog's T5s have learned positions).
        tokenizer, placeholder = family_tokenizer(model)
        return FamilyLaunch(tokenizer_type=tokenizer.tokenizer_type,
                            tokenizer_model=tokenizer.origin,
                            tokenizer_vocab_size=tokenizer.vocab_size, rotary_base=10000,
                            bridge_recipe=recipe, placeholder=placeholder, router=router)
    if entry is None:
        return FamilyLaunch(tokenizer_type="NullTokenizer", tokenizer_model="none",
                            tokenizer_vocab_size=model.vocab_size, rotary_base=10000,
                            bridge_recipe=recipe, placeholder=True,
                            recipe_builds_model=builds, router=router)
    values = {key: sourced_field(entry, key, f"{where} families.{model.family}")[0]
              for key in ("tokenizer_type", "tokenizer_model", "tokenizer_vocab_size",
                          "rotary_base")}
    return FamilyLaunch(tokenizer_type=str(values["tokenizer_type"]),
                        tokenizer_model=str(values["tokenizer_model"]),
                        tokenizer_vocab_size=int(values["tokenizer_vocab_size"]),
                        rotary_base=int(values["rotary_base"]),
                        bridge_recipe=recipe, recipe_builds_model=builds, router=router)


def _bridge_recipe(model: ModelSpec, data: dict, family: dict | None) -> tuple[str, bool]:
    """(``module:function``, whether it builds this very model): the model's own MoE
    recipe, else (for a known family) the model's or the family's recipe, else
    vanilla GPT."""
    where = "heuristics/launch.yaml"
    own = data.get("moe_recipes") or {}
    if model.name in own:
        recipe, builds = sourced_field(own, model.name, f"{where} moe_recipes")[0], True
    elif family is not None and model.name in (data.get("recipes_by_model") or {}):
        recipe, builds = sourced_field(data["recipes_by_model"], model.name, where)[0], False
    elif family is not None:
        recipe = sourced_field(family, "bridge_recipe", f"{where} families.{model.family}")[0]
        builds = False
    else:
        recipe, builds = sourced_field(data, "fallback_bridge_recipe", where)[0], False
    if ":" not in str(recipe):
        raise CatalogError(f"{where}: bridge_recipe {recipe!r} must be 'module:function'")
    return str(recipe), builds


def _router(model: ModelSpec, data: dict) -> MoeRouter:
    """The model's router (``moe_router`` by model name, then family, then default)."""
    table = data.get("moe_router") or {}
    key = next((k for k in (model.name, model.family) if k and k in table), "default")
    if key not in table:
        return MoeRouter()
    value, source = sourced_field(table, key, "heuristics/launch.yaml moe_router")
    return MoeRouter.from_mapping(dict(value), source, f"heuristics/launch.yaml moe_router.{key}")


def launch_spec(model: ModelSpec, workload: Workload, plan: Plan, cluster: Cluster, *,
                software: SoftwareFeatures | None = None, stack: str | None = None,
                base: BaseConfig | None = None, base_path: str | None = None,
                slurm: SlurmSettings = SlurmSettings()) -> LaunchSpec:
    """Build the spec once; without ``base`` use ``autoconfig base``'s defaults for
    the model and say so in ``base_source``; without ``software``, the features of
    ``stack`` (default: the default stack), so the flags always match the stack named."""
    stack = stack or DEFAULT_STACK
    software = software or load_stack(stack).features
    if base is None:
        base = base_for_model(model, workload.precision)
        source = (f"autoconfig base defaults for {model.name} (no --base given: "
                  "Chinchilla tokens, GPT-3 LR table and schedule)")
        if model.is_encoder_decoder or published_schedule(model):
            source = (f"autoconfig base defaults for {model.name} (no --base given: its "
                      "published schedule and batch; `autoconfig base` cites each value)")
    else:
        source = f"base config {base_path}" if base_path else "base config (given)"
    return LaunchSpec(model=model, base=base, base_source=source, plan=plan, workload=workload,
                      software=software, stack=stack, cluster=cluster,
                      family=family_launch(model), slurm=slurm)


def spec_from_result(result, *, base: BaseConfig | None = None, base_path: str | None = None,
                     slurm: SlurmSettings = SlurmSettings()) -> LaunchSpec:
    """The spec of a search's best plan (``autoconfig.training.search.SearchResult``)."""
    return launch_spec(result.model, result.workload, result.best, result.cluster,
                       software=result.software, stack=result.stack, base=base,
                       base_path=base_path, slurm=slurm)
