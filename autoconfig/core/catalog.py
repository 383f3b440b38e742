"""The GPU and model catalogs in ``configs/`` (one YAML file per item).

Nothing is loaded at import time: the CLI reads only what a command asks for.
Users may give a path to a YAML file of their own instead of a catalog name.
"""

import difflib
from numbers import Integral
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from autoconfig.bounds import POSITIVE, check_number
from autoconfig.errors import CatalogError, InputError, shown
from autoconfig.core.hardware import GPU
from autoconfig.core.model import ModelSpec
from autoconfig.paths import configs_dir
from autoconfig.units import parse_count
from autoconfig.yamlio import load_yaml, require_source, sourced_field, sourced_number

_GPU_NUMBERS = ("peak_bf16_tflops", "hbm_capacity_gb", "hbm_bandwidth_gb_per_s",
                "nvlink_bandwidth_gb_per_s", "gpus_per_node", "nvlink_domain_gpus",
                "internode_bandwidth_gb_per_s")
_GPU_COUNTS = ("gpus_per_node", "nvlink_domain_gpus", "sm_count")
"""GPU fields that count things: whole numbers (int() cut 3.5 GPUs per node to 3)."""
_MODEL_INTS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
               "ffn_hidden_size", "vocab_size", "seq_len")
_MODEL_OPTIONAL_INTS = ("kv_channels", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                        "qk_rope_head_dim", "v_head_dim", "num_experts", "moe_topk",
                        "moe_ffn_hidden_size", "moe_shared_expert_ffn_hidden_size",
                        "moe_first_dense_layers", "moe_layer_freq", "mtp_layers",
                        "sliding_window", "decoder_layers", "decoder_seq_len")
"""Mixture-of-experts, multi-latent attention, head-width and encoder-decoder
fields (``ModelSpec``)."""


def gpu_from_yaml(path: Path) -> GPU:
    """Parse and validate one GPU file; every number needs its source."""
    data = load_yaml(path)
    name = data.get("name") or path.stem
    numbers = {key: _positive(key, sourced_number(data, key, path), path)
               for key in (*_GPU_NUMBERS, "sm_count")}
    fp8 = sourced_number(data, "peak_fp8_tflops", path, optional=True)
    fp8 = fp8 if fp8 is None else _positive("peak_fp8_tflops", fp8, path)
    return GPU(
        name=str(name), display_name=str(data.get("display_name", name)),
        peak_bf16_tflops=float(numbers["peak_bf16_tflops"]), peak_fp8_tflops=fp8,
        hbm_capacity_gb=float(numbers["hbm_capacity_gb"]),
        hbm_bandwidth_gb_per_s=float(numbers["hbm_bandwidth_gb_per_s"]),
        nvlink_bandwidth_gb_per_s=float(numbers["nvlink_bandwidth_gb_per_s"]),
        gpus_per_node=int(numbers["gpus_per_node"]),
        nvlink_domain_gpus=int(numbers["nvlink_domain_gpus"]),
        internode_bandwidth_gb_per_s=float(numbers["internode_bandwidth_gb_per_s"]),
        aliases=tuple(str(a) for a in data.get("aliases", ())),
        generation=_generation(data, path),
        sm_count=int(numbers["sm_count"]),
        tdp_w=_optional_positive(data, "tdp_w", path),
        node_power_w=_optional_positive(data, "node_power_w", path),
        peak_fp16_vector_tflops=_optional_positive(data, "peak_fp16_vector_tflops", path),
        peak_nvfp4_tflops=_optional_positive(data, "peak_nvfp4_tflops", path),
        host_link_gb_per_s=_optional_positive(data, "host_link_gb_per_s", path),
        cuda_memory_mib=_optional_positive(data, "cuda_memory_mib", path))


def _generation(data: dict, path: Path) -> str:
    """The GPU generation (ampere, hopper, blackwell...): which step-time constants
    of heuristics/perf.yaml apply. Required: a GPU the model has no constants for
    must say so, not silently borrow another's."""
    if data.get("generation") is None:
        raise CatalogError(f"{path}: missing field 'generation' (the GPU architecture, e.g. "
                           "hopper; it picks the constants of heuristics/perf.yaml)")
    value, _ = sourced_field(data, "generation", path)
    return str(value)


def _positive(key: str, value: float, path: Path) -> float:
    """A GPU field's value when positive, and whole for a count (``sourced_number``
    has refused NaN and infinities); else CatalogError naming file, field, value."""
    if key in _GPU_COUNTS and (value <= 0 or value != int(value)):
        raise CatalogError(f"{path}: field {key!r} must be a positive whole number, got {value}")
    if value <= 0:
        raise CatalogError(f"{path}: field {key!r} must be positive, got {value}")
    return value


def _optional_positive(data: dict, key: str, path: Path) -> float | None:
    value = sourced_number(data, key, path, optional=True)
    return None if value is None else float(_positive(key, value, path))


def model_from_yaml(path: Path) -> ModelSpec:
    """Parse and validate one model file; its ``source:`` covers the shape."""
    data = load_yaml(path)
    require_source(data, path)
    if "published_batch_tokens" in data and \
            not str(data.get("published_batch_tokens_source", "")).strip():
        raise CatalogError(f"{path}: published_batch_tokens has no "
                           "published_batch_tokens_source")
    missing = [key for key in _MODEL_INTS if key not in data and key != "num_kv_heads"
               and not (key == "num_layers" and "encoder_layers" in data)]
    if missing:
        raise CatalogError(f"{path}: missing field(s) {', '.join(missing)}")
    _schedule_of(data, path)
    return model_from_mapping(data, default_name=path.stem, where=str(path))


def model_from_mapping(data: dict, default_name: str, where: str) -> ModelSpec:
    """Build a ModelSpec from a plain mapping (a catalog file or inline flags)."""
    values = {}
    data = _with_stack_layers(data, where)
    for key in _MODEL_INTS:
        raw = data.get(key, data.get("num_heads") if key == "num_kv_heads" else None)
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise CatalogError(f"{where}: field {key!r} must be an integer, got {shown(raw)}")
        values[key] = raw
    for key in _MODEL_OPTIONAL_INTS:
        if key in data:
            raw = data[key]
            if isinstance(raw, bool) or not isinstance(raw, int):
                raise CatalogError(f"{where}: field {key!r} must be an integer, got {shown(raw)}")
            values[key] = raw
    try:
        return _spec_from_mapping(data, default_name, where, values)
    except InputError as exc:  # the shape's own checks: name the file (or inline shape)
        raise type(exc)(f"{where}: {exc}") from None


def _with_stack_layers(data: dict, where: str) -> dict:
    """An encoder-decoder file gives ``encoder_layers`` and ``decoder_layers``
    (as Megatron's --encoder-num-layers/--decoder-num-layers); the stack's
    ``num_layers`` is their sum. Giving num_layers too must agree."""
    if "encoder_layers" not in data:
        return data
    enc, dec = data.get("encoder_layers"), data.get("decoder_layers")
    for key, raw in (("encoder_layers", enc), ("decoder_layers", dec)):
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
            raise CatalogError(f"{where}: field {key!r} must be a positive integer, "
                               f"got {shown(raw)}")
    if "num_layers" in data and data["num_layers"] != enc + dec:
        raise CatalogError(f"{where}: num_layers {shown(data['num_layers'])} is not "
                           f"encoder_layers + decoder_layers ({enc + dec}); give only the two")
    return {**data, "num_layers": enc + dec}


def _spec_from_mapping(data: dict, default_name: str, where: str, values: dict) -> ModelSpec:
    return ModelSpec(
        attention_kind=str(data.get("attention_kind", "gqa")),
        qk_norm=_flag(data, "qk_norm", False, where),
        attention_sinks=_flag(data, "attention_sinks", False, where),
        name=str(data.get("name", default_name)), **values,
        mlp_kind=str(data.get("mlp_kind", "gelu")),
        norm_kind=str(data.get("norm_kind", "layernorm")),
        position_embedding=str(data.get("position_embedding", "learned")),
        tied_embeddings=_flag(data, "tied_embeddings", True, where),
        has_bias=_flag(data, "has_bias", True, where),
        hidden_dropout=_probability(data, "hidden_dropout", where),
        attention_dropout=_probability(data, "attention_dropout", where),
        published_batch_tokens=data.get("published_batch_tokens"),
        family=str(data.get("family", "")), size_label=str(data.get("size", "")))


def _flag(data: dict, key: str, default: bool, where: str) -> bool:
    """A true/false field (``default`` when absent): bool() read 'maybe' as true."""
    raw = data.get(key, default)
    if not isinstance(raw, bool):
        raise CatalogError(f"{where}: field {key!r} must be true or false, got {shown(raw)}")
    return raw


DEFAULT_DROPOUT = 0.1
"""Megatron-LM's --hidden-dropout and --attention-dropout defaults (megatron/training/arguments.py)."""


def _probability(data: dict, key: str, where: str) -> float:
    """A dropout probability; ModelSpec checks the range. When the mapping does
    not give it, a shape of a catalog family (e.g. a scaled llama3 written by
    ``autoconfig base``) trains like that family, else Megatron's default 0.1."""
    raw = data.get(key)
    if raw is None:
        return _family_dropout().get((str(data.get("family", "")), key), DEFAULT_DROPOUT)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise CatalogError(f"{where}: field {key!r} must be a number, got {shown(raw)}")
    return float(raw)


@lru_cache(maxsize=None)
def _family_dropout() -> dict:
    """(family, dropout field) -> value stated by the catalog files of that family
    (raw YAML, so building the catalog itself does not recurse)."""
    out = {}
    for path in sorted((configs_dir() / "models").glob("*.yaml")):
        data = load_yaml(path)
        family = data.get("family")
        for key in ("hidden_dropout", "attention_dropout"):
            value = data.get(key)
            if family and isinstance(value, (int, float)) and not isinstance(value, bool):
                out[(str(family), key)] = float(value)
    return out


SCHEDULE_KEYS = ("lr", "min_lr", "lr_decay_style", "lr_warmup_steps", "lr_warmup_tokens",
                 "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad",
                 "init_method_std", "tokens")
"""What a model file's ``published_schedule`` may state (each {value, source})."""


def published_schedule(model: ModelSpec) -> dict:
    """{key: (value, source)} of the ``published_schedule`` block of the catalog
    file the model comes from (same name), or {} when it has none."""
    return dict(_schedules().get(model.name, ()))


LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
"""What a published ``lr_decay_style`` may be: Megatron-LM's --lr-decay-style
choices (the launch files pass it on)."""


@lru_cache(maxsize=None)
def _schedules() -> dict:
    out = {}
    for path in sorted((configs_dir() / "models").glob("*.yaml")):
        data = load_yaml(path)
        schedule = _schedule_of(data, path)
        if schedule:
            out[str(data.get("name", path.stem))] = schedule
    return out


def _schedule_of(data: dict, path: Path) -> tuple:
    """The checked ``published_schedule`` block of a model file: ((key, (value,
    source)), ...); () when there is none. Each key one of SCHEDULE_KEYS mapped
    to {value, source}; lr_decay_style one of LR_DECAY_STYLES, every other value
    a positive finite number (YAML reads ``14.8e12`` without a sign as text, so
    numeric text counts). One-line errors that name the file."""
    block = data.get("published_schedule")
    if block is None or block == {}:
        return ()
    if not isinstance(block, dict):
        raise CatalogError(f"{path}: published_schedule must map keys to {{value, source}}, "
                           f"got {shown(block)}")
    unknown = sorted(shown(key) for key in block if key not in SCHEDULE_KEYS)
    if unknown:
        raise CatalogError(f"{path}: unknown published_schedule key(s) {', '.join(unknown)}: "
                           f"allowed are {', '.join(SCHEDULE_KEYS)}")
    entries = []
    for key in block:
        value, source = sourced_field(block, key, f"{path}: published_schedule")
        if key == "lr_decay_style":
            if not isinstance(value, str) or value not in LR_DECAY_STYLES:
                raise CatalogError(f"{path}: published_schedule lr_decay_style {shown(value)}: "
                                   f"allowed are {', '.join(LR_DECAY_STYLES)}")
        elif not _positive_number(value):
            raise CatalogError(f"{path}: published_schedule {key} {shown(value)} is not a "
                               "positive number")
        entries.append((key, (value, source)))
    return tuple(entries)


def _positive_number(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return False
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return False
    return 0 < number < float("inf")


@lru_cache(maxsize=None)
def all_gpus() -> tuple[GPU, ...]:
    return tuple(gpu_from_yaml(p) for p in sorted((configs_dir() / "gpus").glob("*.yaml")))


@lru_cache(maxsize=None)
def all_models() -> tuple[ModelSpec, ...]:
    return tuple(model_from_yaml(p) for p in sorted((configs_dir() / "models").glob("*.yaml")))


def looks_like_path(text: str) -> bool:
    return text.endswith((".yaml", ".yml")) or "/" in text


def get_gpu(name: str) -> GPU:
    """A catalog GPU by name or alias, or a user's YAML file by path."""
    if looks_like_path(name):
        return gpu_from_yaml(Path(name))
    key = name.strip().lower()
    for gpu in all_gpus():
        if key == gpu.name or key in gpu.aliases:
            return gpu
    allowed = ", ".join(g.name for g in all_gpus())
    raise InputError(f"unknown GPU {name!r}: allowed are {allowed}, or a path to a GPU YAML file")


def get_model(name: str, size: str | None = None) -> ModelSpec:
    """A catalog model by family and size (``gpt3``, ``175b``), by full name
    (``llama3-8b``), or a user's YAML file by path."""
    if looks_like_path(name):
        return model_from_yaml(Path(name))
    key = name.strip().lower()
    models = all_models()
    if size is not None:
        family = [m for m in models if m.family == key]
        if not family:
            raise InputError(f"unknown model {name!r}: allowed are {', '.join(families())}, "
                             "or a path to a model YAML file")
        # Labels such as 8x7b or 30b-a3b name an MoE size as it is published.
        for model in family:
            if model.size_label.lower() == size.strip().lower():
                return model
        if not _plain_size(size) and not all(_plain_size(m.size_label) for m in family):
            sizes = ", ".join(m.size_label for m in family)
            raise InputError(f"unknown size {size!r} for model {name!r}: allowed are {sizes}")
        wanted = _normalise_size(size)  # InputError naming the size form for a bad count
        for model in family:
            if _plain_size(model.size_label) and _normalise_size(model.size_label) == wanted:
                return model
        sizes = ", ".join(m.size_label for m in family)
        raise InputError(f"unknown size {size!r} for model {name!r}: allowed are {sizes}")
    for model in models:
        if key == model.name:
            return model
    family = [m for m in models if m.family == key]
    if len(family) == 1:
        return family[0]
    if family:
        sizes = ", ".join(m.size_label for m in family)
        raise InputError(f"model {name!r} needs --size: allowed are {sizes}")
    names = sorted({m.name for m in models})
    close = difflib.get_close_matches(key, names + list(families()), n=3, cutoff=0.6)
    raise InputError(f"unknown model {name!r}: allowed are the {len(names)} catalog models "
                     f"(`autoconfig catalog models`"
                     + (f"; closest: {', '.join(close)}" if close else "")
                     + "), or a path to a model YAML file")


def families() -> tuple[str, ...]:
    return tuple(sorted({m.family for m in all_models() if m.family}))


def _plain_size(size: str) -> bool:
    """A count like 175b or 1.3b (not a label like 8x7b)."""
    text = size.strip().lower()
    return bool(text) and all(c.isdigit() or c in ".kmbt" for c in text)


def _normalise_size(size: str) -> float:
    return round(parse_count(size, what="size"), -3)


DEFAULT_SEQ_LEN = 2048
"""Sequence length of an inline shape given without one."""


def resolve_model(model: str | None, size: str | None, layers: int | None, hidden: int | None,
                  heads: int | None, kv_heads: int | None, ffn: int | None, vocab: int | None,
                  swiglu: bool, seq_len: int | None) -> ModelSpec | None:
    """The catalog model, the inline shape, or None when neither was given."""
    inline = {"--layers": layers, "--hidden": hidden, "--heads": heads, "--vocab": vocab}
    if model is not None:
        if any(v is not None for v in inline.values()) or kv_heads or ffn:
            raise InputError("give either --model or an inline shape (--layers --hidden "
                             "--heads --vocab ...), not both")
        return get_model(model, size)
    if all(v is None for v in inline.values()):
        return None
    missing = [flag for flag, v in inline.items() if v is None]
    if missing:
        raise InputError(f"inline model shape needs {', '.join(missing)} "
                         "(with --layers --hidden --heads --vocab, optional --kv-heads --ffn)")
    for flag, value in (*inline.items(), ("--kv-heads", kv_heads), ("--ffn", ffn)):
        # before any arithmetic: a text or fractional count from a Python caller or a
        # file is named, not a TypeError
        if value is not None and (isinstance(value, bool) or not isinstance(value, Integral)
                                  or value < 1):
            raise InputError(f"invalid {flag} {shown(value)}: must be a positive integer")
    if ffn is None:
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
    data = {"name": f"custom-{layers}l-{hidden}h", "num_layers": layers, "hidden_size": hidden,
            "num_heads": heads, "num_kv_heads": kv_heads or heads, "ffn_hidden_size": ffn,
            "vocab_size": vocab, "seq_len": seq_len or DEFAULT_SEQ_LEN,
            "mlp_kind": "swiglu" if swiglu else "gelu",
            "norm_kind": "rmsnorm" if swiglu else "layernorm",
            "position_embedding": "rope" if swiglu else "learned",
            "tied_embeddings": not swiglu, "has_bias": not swiglu}
    return model_from_mapping(data, default_name=data["name"], where="inline shape")


ARCHITECTURE_FIELDS = {"mlp": "mlp_kind", "norm": "norm_kind", "positions": "position_embedding",
                       "tied_embeddings": "tied_embeddings", "bias": "has_bias",
                       "dropout": ("hidden_dropout", "attention_dropout")}


def with_architecture(model: ModelSpec, **changes) -> ModelSpec:
    """An inline model with architecture details changed (None keeps the model's):
    mlp (gelu|swiglu), norm (layernorm|rmsnorm), positions (learned|rope),
    tied_embeddings, bias, dropout (hidden and attention alike)."""
    values = {}
    for key, value in changes.items():
        if value is None:
            continue
        target = ARCHITECTURE_FIELDS[key]
        for name in (target if isinstance(target, tuple) else (target,)):
            values[name] = value
    if "hidden_dropout" in values and not 0.0 <= values["hidden_dropout"] < 1.0:
        raise InputError(f"invalid --dropout {values['hidden_dropout']}: must be in [0, 1)")
    return replace(model, **values) if values else model


def with_layers(model: ModelSpec, **fields) -> ModelSpec:
    """A model with mixture-of-experts, multi-latent-attention or head-width
    fields changed (``ModelSpec`` field -> value; None keeps the model's). A KV
    rank turns multi-latent attention on. The ModelSpec checks the result."""
    values = {k: v for k, v in fields.items() if v is not None}
    if not values:
        return model
    if "decoder_layers" in values:
        # Megatron's convention: --num-layers (--layers) are the encoder's when a
        # decoder is added; the stack is both.
        encoder = model.encoder_layers if model.is_encoder_decoder else model.num_layers
        values["num_layers"] = encoder + values["decoder_layers"]
    if values.get("kv_lora_rank"):
        values["attention_kind"] = "mla"
        values.setdefault("num_kv_heads", model.num_heads)
    return replace(model, name=model.name if model.name.startswith("custom") else
                   f"{model.name}-custom", **values)


def with_network(gpu: GPU, internode_gb_per_s: float | None) -> GPU:
    """The GPU with another scale-out bandwidth per GPU (a cluster whose network
    differs from the DGX/HGX figure of the catalog); None keeps the catalog's."""
    if internode_gb_per_s is None:
        return gpu
    return replace(gpu, internode_bandwidth_gb_per_s=check_number(
        "--internode-gb-per-s", internode_gb_per_s, POSITIVE))
