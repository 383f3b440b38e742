"""Published measured runs (benchmarks/published_runs.csv) as model inputs.

``load_runs`` turns each CSV row into a ``Run``: (ModelSpec, Workload, Plan,
Cluster, SoftwareFeatures, measured figure) or, when the row cannot be used,
the reason. Fields a source leaves unstated get the assumptions below; each is
named in ``Run.assumptions`` so the validation table shows what was assumed.

Assumptions per source (see benchmarks/SOURCES.md):
* S01/S04 (Narayanan et al. 2021; Megatron-LM README Jan 2021): full
  recompute (the paper's eq. 3 counts the recompute forward), MBS 1, TP x PP
  from the model-parallel size (TP = min(8, mp), PP = mp / TP, as the 2021
  README says), fp16 (gradients reduced in fp16, not overlapped), no fused
  attention. S01 uses the interleaved schedule and the scatter/gather of
  pipeline sends (Sec. 5.1); S04 has neither. S01's chunk count is
  unstated: we take the smallest v > 1 dividing the stage's layers.
  Measured: TFLOP/s incl. recompute (eq. 3).
* S05 (Megatron-LM README 2020): TP only, full recompute (2020 GPT-2
  scripts use --checkpoint-activations), no micro-batching (MBS = batch per
  replica; eq. 3 with it reproduces the table's TFLOP/s), A100 40GB (DGX A100
  of 2020). Measured: iteration time.
* S10 (BLOOM): Jean Zay nodes (4 x 100 Gb/s Omni-Path per 8 GPUs), full
  recompute, ZeRO-1 (= distributed optimizer), no SP, no interleaving, no
  fused attention, pipeline sends split over TP (DeepSpeed's partitioned
  pipe buffers), vocab 250,880 where given as
  "250k"; embedding counted as a pipeline layer where the row's note records
  --pp-partition-method 'type:transformer|embedding' (02-28 on, production);
  framework Megatron-DeepSpeed (its per-layer per-micro-batch cost in
  heuristics/perf.yaml). Measured: iteration time; memory: nvidia-smi device
  memory (GiB) of the larger of first and last stage, with 16-bit gradients
  ('fp16' recipe) until the DeepSpeed BF16 optimizer with fp32 gradient
  accumulation ('bf16_fp32_accum', 02-28 on).
* S15 (NeMo launcher, confidence C): configuration from the default yaml as
  the CSV records it; no fused attention (2022). Measured: tokens/s.
* S17 (Megatron CI): as stated (vocab padded to a multiple of 128 x TP, as
  Megatron does); fused attention, overlapped DP; memory: torch max allocated
  (GB = 1e9 B) on the last rank. Measured:
  iteration time, but in deterministic mode with NCCL_ALGO=Ring ("not a tuned
  perf benchmark"), so used for memory and plan ranking, not throughput MAPE.
* S08 (Megatron-Bridge): SP on when TP > 1 (the recipes' default), no
  recompute, distributed optimizer, Llama 3 vocab 128,256. FP8-CS, FP8-MX,
  MXFP8 and unqualified FP8 map to ``fp8``; no dropout (Llama recipes);
  TP communication overlapped with GEMMs (the performance recipes set
  comm_overlap.tp_comm_overlap_cfg = userbuffers_*) and gradients reduced in
  bf16 (they set ddp.grad_reduce_in_fp32 = False; scripts/performance/configs/
  llama3/llama3_70b_llm_pretrain.py). Measured: tokens/s/GPU.
* S09 (llm-foundry benchmark tables, MPT models on the MosaicML platform):
  pure PyTorch FSDP, read as TP = PP = CP = 1 and DP = all GPUs with the
  distributed optimizer, plus the per-micro-batch parameter all-gathers and
  gradient reduce-scatters of ``SoftwareFeatures.param_gathers_per_microbatch``
  (2 for FULL_SHARD, 1 for SHARD_GRAD_OP), mostly overlapped; activation
  checkpointing = full recompute; MPT layer (GELU MLP 4h, LayerNorm without
  biases, learned positions, tied embeddings, no dropout), fused attention
  with llm-foundry's own kernel (``SoftwareFeatures.attention_kernel``);
  gradients reduced in fp32 (Composer's mixed_precision DEFAULT); framework
  ``pytorch-fsdp``; H100 nodes with the DGX figure of 8 x 400 Gb/s (A100
  rows state 1600 Gb/s per node, the DGX A100 figure). Measured:
  tokens/s/GPU (the tables' MFU counts the same FLOPs as
  ``autoconfig.core.model.model_flops_per_token``, so comparing tokens/s compares
  like with like).

Rows that cannot be used for throughput (OOM, inconsistent figures) keep
their model and plan where those are known, so the memory check
(``autoconfig.validation.scoring.predict_memory_bytes``, also used by
benchmarks/fit_memory.py) sees every measured peak and OOM.
"""

import csv
import io
import dataclasses
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.errors import AutoconfigError, InputError, shown
from autoconfig.textfile import read_text
from autoconfig.core.hardware import Cluster, cluster_from_gpus
from autoconfig.core.model import ModelSpec, hardware_flops_per_token

from autoconfig.core.plan import Plan, Workload, short_last_stage_split, stage_layers
from autoconfig.paths import benchmarks_dir
from autoconfig.training.space import stage_splits
from autoconfig.training.fp8 import ALIASES as FP8_ALIASES, FP8_RECIPES, recipe_name
from autoconfig.training.stack import (SoftwareFeatures, load_stack, override_flags,
                                       with_overrides)
from autoconfig.yamlio import load_yaml

MEASURES = ("step_time_s", "hardware_tflops_per_gpu", "tokens_per_s_per_gpu")


@dataclass(frozen=True)
class Run:
    record_id: str
    source_id: str
    model_name: str
    model: ModelSpec | None = None
    workload: Workload | None = None
    plan: Plan | None = None
    cluster: Cluster | None = None
    stack: str = ""
    """The software stack the source ran (heuristics/stacks/)."""
    software: SoftwareFeatures = SoftwareFeatures()
    """The stack's features with what the source states on top."""
    measure: str = ""
    """Which figure the row measured: one of MEASURES."""
    measured: float | None = None
    memory_bytes: float | None = None
    """Measured peak memory per GPU in bytes where the source gives it."""
    memory_kind: str = "device"
    """What the memory figure counts: ``device`` (nvidia-smi: CUDA context, NCCL
    buffers and the caching allocator's reserve included) or ``allocated`` (torch
    ``max_memory_allocated``: tensors only)."""
    memory_stage: str = "worst"
    """Which pipeline rank was measured: ``worst`` (max over first and last) or ``last``."""
    memory_recipe: str = "bf16"
    """Row of heuristics/memory.yaml bytes_per_param the run's mixed precision uses."""
    oom: bool = False
    skip_reason: str = ""
    throughput_benchmark: bool = True
    """False where the source says its timing is not a tuned benchmark (Megatron CI in
    deterministic mode): used for memory and plan ranking, not for throughput MAPE."""
    assumptions: tuple[str, ...] = field(default_factory=tuple)
    fp8_recipe: str = ""
    """The FP8 recipe where the row names one (``mxfp8``, ``tensorwise``,
    ``blockwise``; also set in ``software``), empty for bf16 and for FP8 without a
    stated recipe (the stack's default). Plans are ranked only against plans of
    the same stated recipe."""
    device: str = ""
    """Where a profiling record was measured (``cuda``, ``cpu``); empty for
    published runs."""

    @property
    def usable(self) -> bool:
        """Usable for throughput (a row may be unusable there but still measure memory)."""
        return not self.skip_reason

    @property
    def memory_usable(self) -> bool:
        """The row measured peak memory or an OOM, for a plan we can build."""
        return self.model is not None and (self.memory_bytes is not None or self.oom)

    def predicted_measure(self, step_time_s: float, tokens_per_s_per_gpu: float) -> float:
        """The predicted figure of the same kind the row measured."""
        if self.measure == "step_time_s":
            return step_time_s
        if self.measure == "tokens_per_s_per_gpu":
            return tokens_per_s_per_gpu
        flops = hardware_flops_per_token(self.model, self.workload.seq_len, "full")
        return tokens_per_s_per_gpu * flops / 1e12


def _num(text: str | None) -> float | None:
    """Leading number of a CSV cell ('131073 (padded ...)' -> 131073), else None."""
    match = re.match(r"\s*([0-9]+(?:\.[0-9]+)?)", text or "")
    return float(match.group(1)) if match else None


def _int(row: dict, key: str) -> int | None:
    value = _num(row.get(key))
    return int(value) if value is not None else None


def _gpu_name(gpu_type: str) -> str | None:
    text = gpu_type.upper()
    if "V100" in text:
        return None
    if "GB300" in text:
        return "gb300"
    if "B300" in text:
        return "b300"
    if "GB200" in text:
        return "gb200"
    if "B200" in text:
        return "b200"
    if "H100" in text:
        return "h100-80gb"
    if "A100" in text:
        return "a100-40gb" if "2020" in text or "A100 40GB" in text else "a100-80gb"
    return None


def _fp8_recipe(text: str) -> str:
    """The FP8 recipe a precision text names (``autoconfig.training.fp8``): MXFP8
    (also written FP8-MX), current scaling (FP8-CS: tensorwise), another block
    granularity (blockwise); empty where it names none (the stack's default)."""
    text = text.upper()
    if "FP8" not in text:
        return ""
    if "MX" in text:
        return "mxfp8"
    if "FP8-CS" in text:
        return "tensorwise"
    return "blockwise" if "GRANULARITY" in text and "NOT STATED" not in text else ""


def _precision(text: str) -> str:
    text = text.upper()
    if "NVFP4" in text:
        return "nvfp4"
    return "fp8" if "FP8" in text else "bf16"


REQUIRED_COLUMNS = ("record_id", "source_id", "model_name", "gpu_type", "precision",
                    "num_gpus", "global_batch_size", "seq_len")


def load_runs(path: Path) -> list[Run]:
    """Every row of a published-runs CSV as a Run (usable or with its skip reason)."""
    reader = csv.DictReader(io.StringIO(read_text(path, "runs file"), newline=""))
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise InputError(f"runs file {str(path)!r} lacks column(s) {', '.join(missing)}")
    return [_checked_row(row) for row in reader]


def _checked_row(row: dict) -> Run:
    """``row_to_run``, where a row the model cannot be asked about (a value out
    of range, a GPU count that is not whole nodes) is a Run with that reason:
    one bad row of a user's file must not stop the rest being scored."""
    try:
        return row_to_run(row)
    except AutoconfigError as exc:
        return Run(record_id=row.get("record_id") or "?", source_id=row.get("source_id") or "?",
                   model_name=row.get("model_name") or "?",
                   skip_reason=f"invalid row {row.get('record_id')}: {str(exc).splitlines()[0]}")


def row_to_run(row: dict) -> Run:
    """A Run; rows whose plan can be built but whose throughput cannot be used
    (OOM, inconsistent figures) keep model and plan for the memory check."""
    base = dict(record_id=row["record_id"], source_id=row["source_id"],
                model_name=row["model_name"])
    empty = [c for c in REQUIRED_COLUMNS if not (row.get(c) or "").strip()]
    if empty:
        return Run(**base, skip_reason=f"{', '.join(empty)} not stated")
    if not (_int(row, "num_gpus") or 0) > 0:
        raise InputError(f"num_gpus {row['num_gpus']!r} must be a whole number from 1")
    reason = _skip_reason(row)
    if reason and not _plan_buildable(row):
        return Run(**base, skip_reason=reason)
    settings = source_settings(row["source_id"])
    assumptions: list[str] = []
    try:
        model = _model(row, settings, assumptions)
        plan = _plan(row, settings, model, assumptions)
    except InputError:
        if reason:
            return Run(**base, skip_reason=reason)
        raise
    if model.unmodelled and not reason:
        return Run(**base, skip_reason=f"{' and '.join(model.unmodelled)}: not modelled")
    if model.is_encoder_decoder and (plan.pp > 1 or plan.cp > 1) and not reason:
        # estimate refuses these plans (megatron-core 0.16 trains T5 on one stage);
        # validate scores only what the commands compute.
        return Run(**base, skip_reason="encoder-decoder over pipeline or context parallel "
                                       "ranks: not modelled (megatron-core has no T5 pp or cp)")
    precision = _precision(row["precision"])
    if precision == "fp8" and "FP8" != row["precision"].strip().upper():
        assumptions.append(f"{row['precision'].split(' ')[0]} as fp8")
    workload = Workload(global_batch_size=_int(row, "global_batch_size"),
                        seq_len=_int(row, "seq_len"), precision=precision)
    gpu = get_gpu(_gpu_name(row["gpu_type"]))
    internode = (settings.get("cluster") or {}).get("internode_gb_per_s")
    if internode:
        gpu = dataclasses.replace(gpu, internode_bandwidth_gb_per_s=float(internode))
        assumptions.append(f"scale-out network {internode} GB/s per GPU")
    if _pytorch_fsdp(row):
        assumptions.append(f"{row['dp_sharding'].split(' ')[-1]} as DP + per-micro-batch "
                           "param gathers and grad reduce-scatter")
    cluster = cluster_from_gpus(gpu, plan.num_gpus, gpu.gpus_per_node)
    measure, measured = _measured(row, settings)
    mem_text = row.get("mem_gb_measured") or ""
    stack, software = _software(row, settings)
    recipe = _fp8_recipe(row["precision"]) or (_recipe_fp8(row) if precision == "fp8" else "")
    if recipe:
        software = dataclasses.replace(software, fp8_recipe=recipe)
    return Run(**base, model=model, workload=workload, plan=plan, cluster=cluster,
               stack=stack, software=software, measure=measure, measured=measured,
               memory_bytes=_memory_bytes(row), oom=mem_text == "OOM",
               memory_kind=_memory_kind(row), memory_stage=_memory_stage(row),
               memory_recipe=_memory_recipe(row, settings), skip_reason=reason,
               assumptions=tuple(assumptions), fp8_recipe=recipe,
               throughput_benchmark=bool(settings.get("throughput_benchmark", True)))


def source_settings(source_id: str) -> dict:
    """What ``benchmarks/run_settings.yaml`` says of a source's runs (one dict per
    source: stack, software overrides, architecture, plan defaults, measure)."""
    settings = _all_settings()
    if source_id not in settings:
        raise InputError(f"no settings for source {source_id!r} in "
                         f"{benchmarks_dir() / 'run_settings.yaml'}: add how its runs were made")
    return settings[source_id]


@lru_cache(maxsize=1)
def _all_settings() -> dict:
    return load_yaml(benchmarks_dir() / "run_settings.yaml")


def _memory_kind(row: dict) -> str:
    return "allocated" if "torch" in (row.get("mem_kind") or "") else "device"


def _memory_stage(row: dict) -> str:
    return "last" if "LAST rank" in (row.get("mem_kind") or "") else "worst"


def _memory_bytes(row: dict) -> float | None:
    """Measured peak in bytes: torch figures are GB = 1e9 B (the S17 column says
    so; 'alloc X / peak Y' -> the peak); nvidia-smi figures are GiB (nvidia-smi
    reports MiB and BLOOM's largest reading is "80GB" on an 81920 MiB card)."""
    text = row.get("mem_gb_measured") or ""
    if not text or text == "OOM":
        return None
    value = _num(text.split("peak")[-1])
    if value is None:
        return None
    return value * (1e9 if _memory_kind(row) == "allocated" else 2**30)


def _memory_recipe(row: dict, settings: dict) -> str:
    """Bytes-per-parameter recipe (heuristics/memory.yaml): a precision cell that
    names the DeepSpeed BF16 optimizer ('BF16 optimizer': fp32 gradient
    accumulation) uses bf16_fp32_accum, an fp16 cell fp16, otherwise the source's
    recipe (BLOOM kept 16-bit gradients with ZeRO-1 before that optimizer), else
    bf16 (Megatron-LM bf16 keeps fp32 main grads)."""
    text = row["precision"]
    if "BF16 optimizer" in text:
        return "bf16_fp32_accum"
    if text.strip().lower().startswith("fp16"):
        return "fp16"
    return str(settings.get("memory_recipe", "bf16"))


def _plan_buildable(row: dict) -> bool:
    """GPU, precision, sharding, shape and layout are all known."""
    return not _shape_reason(row)


def _skip_reason(row: dict) -> str:
    reason = _shape_reason(row)
    if reason:
        return reason
    if (row.get("mem_gb_measured") or "") == "OOM":
        return "OOM row: no throughput measured"
    if _measured(row, source_settings(row["source_id"]))[1] is None:
        return "no throughput figure"
    if (row.get("derived_fields") or "").startswith("CHECK"):
        return "row flagged inconsistent in the source"
    if not _step_matches_tflops(row):
        return "step time and TFLOP/s disagree (>15%) for the stated shape and batch"
    return ""


SHAPE_AND_LAYOUT = ("num_layers", "hidden_size", "num_heads", "tp", "pp", "mp_size_reported")
"""Cells whose text must start with a number when given (a typo there is named,
not read as "not stated")."""


def _shape_reason(row: dict) -> str:
    """Why no plan can be built for the row ('' when one can)."""
    if _gpu_name(row["gpu_type"]) is None:
        return f"GPU {row['gpu_type'].split(' ')[0]} not in the GPU catalog"
    sharding = row.get("dp_sharding") or ""
    if ("ZeRO-3" in sharding or "FSDP" in sharding) and not (
            _pytorch_fsdp(row) or _megatron_fsdp(row)):
        return f"{sharding.split(' (')[0]}: this fully sharded data parallel is not modelled"
    unreadable = [f"{key} {shown(row[key])}" for key in SHAPE_AND_LAYOUT
                  if (row.get(key) or "").strip() and _num(row[key]) is None]
    if unreadable:
        return f"{', '.join(unreadable)}: not a number"
    # A row naming a catalog model (MoE, T5) takes the catalog's shape, as --model does.
    if not (row.get("catalog_model") or "").strip() and not (
            _int(row, "num_layers") and _int(row, "hidden_size") and _int(row, "num_heads")):
        return "model shape (layers/hidden/heads) not stated"
    if _int(row, "tp") is None and _int(row, "mp_size_reported") is None:
        return "parallel layout (TP/PP) not stated"
    return ""


def _pytorch_fsdp(row: dict) -> bool:
    """A pure PyTorch FSDP row (llm-foundry, S09): modelled as DP with sharded params."""
    return (row.get("dp_sharding") or "").startswith("PyTorch FSDP")


def _megatron_fsdp(row: dict) -> bool:
    """A Megatron-FSDP row sharding over the whole data-parallel group (the
    Megatron-Bridge recipes' optim_grads_params): megatron-core with
    ``--fsdp-sharding full-shard``. Hybrid sharding (HSDP) is not modelled."""
    sharding = (row.get("dp_sharding") or "")
    return sharding.startswith("Megatron-FSDP") and not sharding.startswith("Megatron-FSDP/HSDP")


def _step_matches_tflops(row: dict) -> bool:
    """Where a row gives both step time and hardware TFLOP/s (BLOOM logs), eq. 3
    (96 B s l h^2 (1 + s/6h + V/16lh)) must link them within 15%; otherwise the
    batch or shape recorded is not the one measured."""
    step, tflops = _num(row.get("step_time_s")), _num(row.get("tflops_per_gpu"))
    kind = (row.get("tflops_kind") or "").lower()
    if step is None or tflops is None or "hardware" not in kind:
        return True
    layers, h, s = _int(row, "num_layers"), _int(row, "hidden_size"), _int(row, "seq_len")
    vocab = _vocab(row, source_settings(row["source_id"]))
    batch, gpus = _int(row, "global_batch_size"), _int(row, "num_gpus")
    flops = 96.0 * batch * s * layers * h * h * (1 + s / (6 * h) + vocab / (16 * layers * h))
    return abs(flops / (step * gpus * 1e12) / tflops - 1.0) <= 0.15


def _vocab(row: dict, settings: dict) -> int:
    """The row's vocabulary, or the architecture's where the row gives none or a
    rounded figure ('250k')."""
    text = (row.get("vocab_size") or "").strip()
    if text and not text.endswith("k"):
        return int(_num(text))
    return int(settings["architecture"]["vocab"])


def _model(row: dict, settings: dict, assumptions: list[str]) -> ModelSpec:
    catalog_name = (row.get("catalog_model") or "").strip()
    if catalog_name:
        # A model the catalog describes in full (MoE, MLA): the row names it, as a
        # user names --model; the row's sequence length wins.
        model = get_model(catalog_name)
        return dataclasses.replace(model, seq_len=_int(row, "seq_len") or model.seq_len)
    arch = settings["architecture"]
    h, heads = _int(row, "hidden_size"), _int(row, "num_heads")
    vocab = _vocab(row, settings)
    if vocab != _int(row, "vocab_size"):
        assumptions.append(f"vocab {vocab}")
    if "padded to multiple of 128*TP" in (row.get("vocab_size") or ""):
        # Megatron --make-vocab-size-divisible-by 128, times TP (megatron/training/tokenizer).
        tp = _int(row, "tp") or 1
        vocab = -(-vocab // (128 * tp)) * 128 * tp
        assumptions.append(f"vocab padded to {vocab}")
    ffn = _int(row, "ffn_hidden_size")
    if ffn is None:
        ffn = 4 * h
        assumptions.append("ffn 4h")
    return ModelSpec(
        name=row["model_name"], num_layers=_int(row, "num_layers"), hidden_size=h,
        num_heads=heads, num_kv_heads=_int(row, "num_kv_heads") or heads,
        ffn_hidden_size=ffn, vocab_size=vocab, seq_len=_int(row, "seq_len"),
        mlp_kind=arch["mlp"], norm_kind=arch["norm"], position_embedding=arch["positions"],
        tied_embeddings=bool(arch["tied_embeddings"]), has_bias=bool(arch["bias"]),
        hidden_dropout=float(arch["dropout"]), attention_dropout=float(arch["dropout"]))


def _plan(row: dict, settings: dict, model: ModelSpec, assumptions: list[str]) -> Plan:
    defaults = settings.get("plan") or {}
    tp, pp = _int(row, "tp"), _int(row, "pp")
    if tp is None:
        # Only the model-parallel size given: TP = min(8, mp), PP = mp / TP (the 2021
        # Megatron-LM README: sizes above 8 use tensor parallelism 8).
        mp = _int(row, "mp_size_reported")
        tp = min(8, mp)
        pp = mp // tp
        assumptions.append(f"tp{tp} pp{pp} from mp {mp}")
    pp = pp or 1
    num_gpus = _int(row, "num_gpus")
    cp = _int(row, "cp") or 1
    dp = num_gpus // (tp * pp * cp)
    mbs = _int(row, "micro_batch_size")
    if mbs is None:
        per_replica = defaults.get("mbs") == "per_replica"
        mbs = _int(row, "global_batch_size") // dp if per_replica else int(defaults.get("mbs", 1))
        assumptions.append(f"mbs {mbs}")
    first, last = _stage_split(row, model, pp, assumptions)
    vp = _int(row, "vp") or _recipe_int(row, "vp")
    if vp is None:
        vp = 1
        if defaults.get("vp") == "smallest" and pp > 1:
            vp = _smallest_chunking(stage_layers(model.num_layers, Plan(
                tp=1, pp=pp, dp=1, first_stage_layers=first, last_stage_layers=last)))
        if vp > 1:
            assumptions.append(f"vp {vp}")
    sp_text = (row.get("sequence_parallel") or "").strip()
    sp = tp > 1 and (sp_text == "yes" or (not sp_text and bool(defaults.get("sp_with_tp"))))
    dist_opt = (row.get("distributed_optimizer") == "yes"
                or bool(defaults.get("distributed_optimizer"))
                or "distributed" in (row.get("dp_sharding") or "") or _pytorch_fsdp(row)
                or _megatron_fsdp(row))
    ep = _int(row, "ep") or 1
    etp = _int(row, "etp") or (tp if model.is_moe else 1)
    modules = (row.get("recompute_modules") or "").strip()
    recompute = "selective" if modules else _recompute(row, defaults)
    return Plan(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, sp=sp, mbs=mbs,
                recompute=recompute, distributed_optimizer=dist_opt,
                first_stage_layers=first, last_stage_layers=last, ep=ep, etp=etp,
                recompute_modules=modules)


def _recipe_value(row: dict, key: str, pattern: str = r"[^;]+") -> str | None:
    """The value the row's ``recipe_settings`` (``key=value`` pairs joined by ';')
    gives ``key``, where it matches ``pattern``; None where it gives none. These
    are settings read from the recipe of the row's release where the table leaves
    them out; the shared columns stay as the source printed them."""
    match = re.search(rf"(?:^|;)\s*{re.escape(key)}=({pattern})",
                      row.get("recipe_settings") or "")
    return match.group(1) if match else None


def _recipe_int(row: dict, key: str) -> int | None:
    """A whole number the row's ``recipe_settings`` states as ``key=N``."""
    value = _recipe_value(row, key, r"\d+")
    return None if value is None else int(value)


def _recipe_fp8(row: dict) -> str:
    """The FP8 recipe the row's ``recipe_settings`` names (``fp8_recipe=``, read from
    the recipe of its release where the table's precision does not say it): its
    canonical name (``autoconfig.training.fp8``), '' where it names none."""
    name = _recipe_value(row, "fp8_recipe", r"[a-z0-9_-]+") or ""
    return recipe_name(name) if name in (*FP8_RECIPES, *FP8_ALIASES) else ""


def _recipe_flag(row: dict, key: str) -> bool | None:
    """A switch the row's ``recipe_settings`` states as ``key=true`` or ``key=false``
    (None where it states none)."""
    value = _recipe_value(row, key, r"(?:true|false)\b")
    return None if value is None else value == "true"


def _cuda_graph(row: dict) -> str | None:
    """The row's recipe's CUDA-graph scope (``recipe_settings`` ``cuda_graph=``):
    ``none``, Transformer Engine's scoped graphs (``te:attn+moe_router+...``) or
    ``full_iteration``; None where it states none."""
    scope = _recipe_value(row, "cuda_graph")
    if scope is None:
        return None
    scope = scope.strip()
    if scope == "full_iteration":
        return "full-iteration"
    return "te-scoped" if scope.startswith("te:") or scope == "transformer_engine" else "none"


def _stage_split(row: dict, model: ModelSpec, pp: int, assumptions: list[str]) -> tuple[int, int]:
    """(first, last) stage layers: what the row's ``pipeline_split`` states
    (``short-last``: every stage ceil(L/pp) layers, the last the rest, as Bridge's
    DeepSeek-V3 and Kimi K2 layouts; ``embedding-and-loss``: Megatron's
    --account-for-embedding/loss-in-pipeline-split); the embedding-and-loss split
    where the row says the pipeline partition counts the embedding as a layer
    (Megatron-DeepSpeed --pp-partition-method 'type:transformer|embedding'), the
    closest-to-even split where pp does not divide the layers, else even (0, 0)."""
    num_layers = model.num_layers
    if pp == 1:
        return 0, 0
    stated = (row.get("pipeline_split") or "").strip()
    vp = _int(row, "vp") or 1
    if stated == "short-last" and short_last_stage_split(num_layers, pp, vp):
        return 0, short_last_stage_split(num_layers, pp, vp)
    splits = stage_splits(num_layers, pp)
    counted = ("pp-partition-method" in (row.get("note") or "")
               or stated == "embedding-and-loss")
    edge = [s for s in splits if s != (0, 0)]
    if (counted or num_layers % pp) and edge:
        assumptions.append(f"stage layers first {edge[0][0]}, last {edge[0][1]}")
        return edge[0]
    return 0, 0


def _smallest_chunking(split: tuple[int, ...]) -> int:
    """Smallest v > 1 dividing every stage's layers (1 if none)."""
    for v in range(2, min(split) + 1):
        if all(layers % v == 0 for layers in split):
            return v
    return 1


def _recompute(row: dict, defaults: dict) -> str:
    text = (row.get("recompute") or "").lower()
    if text.startswith("full ("):
        return "full"
    if "selective" in text:
        return "selective"
    if text == "none":
        return "none"
    return str(defaults.get("recompute", "none"))


def _software(row: dict, settings: dict) -> tuple[str, SoftwareFeatures]:
    """(stack name, features): the source's stack with its stated overrides, then
    what the row itself states (FSDP sharding strategy, 16-bit gradients)."""
    stack = load_stack(settings["stack"])
    features = with_overrides(stack.features, **(settings.get("software") or {}))
    if _pytorch_fsdp(row):
        # FULL_SHARD gathers each unit's params in forward and again in backward;
        # SHARD_GRAD_OP keeps them from forward to backward (PyTorch ShardingStrategy docs).
        gathers = 1 if "SHARD_GRAD_OP" in row["dp_sharding"] else 2
        features = dataclasses.replace(features, param_gathers_per_microbatch=gathers)
    elif _megatron_fsdp(row):
        features = with_overrides(features, fsdp_sharding="full-shard")
    offload = _recipe_int(row, "cpu_offloading_num_layers")
    if offload:
        features = with_overrides(features, cpu_offload_layers=offload)
    dispatcher = (row.get("moe_dispatcher") or "").strip()
    overlap = (row.get("moe_a2a_overlap") or "").strip()
    if dispatcher or overlap:
        features = with_overrides(features, moe_dispatcher=dispatcher or None,
                                  moe_a2a_overlap={"true": True, "false": False}.get(overlap))
    graph = _cuda_graph(row)
    if graph:
        features = with_overrides(features, cuda_graph=graph)
    tp_overlap = _recipe_flag(row, "tp_comm_overlap")
    if tp_overlap is not None:
        # the row's recipe sets TP comm-GEMM overlap apart from its stack (the
        # Bridge NVFP4 recipes of 26.04 turn it off)
        features = with_overrides(features, tp_comm_overlap=tp_overlap)
    if features.framework == "megatron-deepspeed" and not row["precision"].startswith("bf16"):
        # fp16 (and unrestated 16-bit) ZeRO-1 runs reduce gradients in 16 bits.
        features = with_overrides(features, grad_reduce_dtype="fp16")
    return stack.name, features


def _measured(row: dict, settings: dict) -> tuple[str, float | None]:
    measure = settings["measure"]
    column = {"hardware_tflops_per_gpu": "tflops_per_gpu"}.get(measure, measure)
    return measure, _num(row.get(column))


def estimate_args(run: Run) -> list[str]:
    """The ``autoconfig estimate`` arguments that describe this run as a user
    would: inline shape and architecture, cluster, plan, stack and every feature
    the run sets apart from its stack. ``estimate`` with them computes what
    ``validate`` scores (tests/test_estimate_parity.py checks every row)."""
    m, plan, w, c = run.model, run.plan, run.workload, run.cluster
    catalog_gpu = get_gpu(c.gpu.name)
    if m.is_moe:  # a catalog model (MoE, MLA): named, as a user would
        args = ["--model", m.name, "--ep", plan.ep, "--etp", plan.etp]
    else:
        args = ["--layers", m.num_layers, "--hidden", m.hidden_size, "--heads", m.num_heads,
                "--kv-heads", m.num_kv_heads, "--ffn", m.ffn_hidden_size,
                "--vocab", m.vocab_size, "--mlp", m.mlp_kind, "--norm", m.norm_kind,
                "--positions", m.position_embedding,
                "--tied-embeddings" if m.tied_embeddings else "--untied-embeddings",
                "--bias" if m.has_bias else "--no-bias", "--dropout", m.hidden_dropout]
    args += ["--gpu", c.gpu.name, "--gpus", c.num_gpus, "--gpus-per-node", c.gpus_per_node,
            "--tp", plan.tp, "--pp", plan.pp, "--vp", plan.vp, "--cp", plan.cp,
            "--mbs", plan.mbs, "--gbs", w.global_batch_size, "--seq-len", w.seq_len,
            "--recompute", plan.recompute, "--precision", w.precision,
            "--memory-recipe", run.memory_recipe, "--stack", run.stack,
            "--sp" if plan.sp else "--no-sp",
            "--distributed-optimizer" if plan.distributed_optimizer
            else "--no-distributed-optimizer",
            "--first-stage-layers", plan.first_stage_layers,
            "--last-stage-layers", plan.last_stage_layers]
    if plan.recompute == "full":
        args += ["--recompute-method", plan.recompute_method,
                 "--recompute-num-layers", plan.recompute_num_layers]
    if plan.recompute_modules:
        args += ["--recompute-modules", plan.recompute_modules]
    if c.gpu.internode_bandwidth_gb_per_s != catalog_gpu.internode_bandwidth_gb_per_s:
        args += ["--internode-gb-per-s", c.gpu.internode_bandwidth_gb_per_s]
    args += override_flags(load_stack(run.stack).features, run.software)
    return [str(a) for a in args]
