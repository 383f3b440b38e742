"""The base training config: model size and shape, tokens, days and
pre-training hyper-parameters, from either a model size or a compute budget.

The pieces live in budget.py (C = k N T and its inverse), shape.py (shapes for
sizes not in the catalog) and hyperparams.py (LR and batch by size); this
module assembles them and reads and writes the base YAML.

Every number comes from ``heuristics/*.yaml`` with its source; this module
only says how they combine.
"""

import math
from dataclasses import fields, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from autoconfig.atomic import write_atomic
from autoconfig.base.budget import (ComputeRate, compute_rate, max_params_chinchilla,
                               max_params_for_tokens, training_days)
from autoconfig.core.catalog import model_from_mapping
from autoconfig.errors import MAX_COUNT, MAX_SEQ_LEN, CatalogError, InputError, shown
from autoconfig.core.hardware import GPU
from autoconfig.heuristics import Sourced, heuristic
from autoconfig.base.hyperparams import (batch_sequences, gpt3_table, init_std, published_batch,
                                    steps_for, table_batch_tokens, table_lr, table_row)
from autoconfig.core.catalog import published_schedule
from autoconfig.core.model import ModelSpec, active_params, total_params
from autoconfig.core.plan import PRECISIONS
from autoconfig.base.shape import (describe_rule, family_template, names_one_model,
                              resolve_sized_model, shape_for_params, shape_rule)
from autoconfig.units import format_count, parse_count
from autoconfig.yamlio import load_yaml

BASE_FORMAT_VERSION = 1
CHINCHILLA = "chinchilla"


@dataclass(frozen=True)
class BaseConfig:
    """A pre-training base config; ``rationale`` says where each value comes from."""

    model: ModelSpec
    global_batch_size: int
    """Sequences per optimizer step."""
    seq_len: int
    precision: str
    gpu_name: str | None
    nodes: int | None
    gpus_per_node: int | None
    mode: str
    """``size`` (size given, days computed) or ``budget`` (days given, size solved)."""
    params: int
    """Exact parameter count of ``model``."""
    tokens: float
    flops_formula: str
    """``6NT`` (model FLOPs, rated by MFU) or ``8NT`` (full recompute, rated by HFU)."""
    total_flops: float
    lr: float
    min_lr: float
    lr_decay_style: str
    lr_warmup_steps: int
    lr_decay_steps: int
    train_steps: int
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    clip_grad: float
    init_method_std: float
    hidden_dropout: float
    attention_dropout: float
    days: float | None = None
    """Training days of this exact model on the cluster (None without a cluster)."""
    budget_days: float | None = None
    """The days the budget allowed (budget mode)."""
    utilisation: float | None = None
    utilisation_kind: str | None = None
    peak_tflops_per_gpu: float | None = None
    stack: str | None = None
    """Software stack the run uses (heuristics/stacks/; `autoconfig base --stack`),
    which `search --base` predicts with unless --stack overrides it."""
    rationale: tuple[tuple[str, str], ...] = ()

    @property
    def batch_tokens(self) -> int:
        return self.global_batch_size * self.seq_len

    @property
    def num_gpus(self) -> int | None:
        return None if self.nodes is None else self.nodes * self.gpus_per_node

    def why(self, key: str) -> str:
        return dict(self.rationale).get(key, "")


@dataclass(frozen=True)
class BaseRequest:
    """What the user asked for, already parsed (see autoconfig/cli/base_cmd.py)."""

    model: str = "gpt3"
    size: str | None = None
    gpu: GPU | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    days: float | None = None
    tokens: float | str | None = None
    """A count, ``"chinchilla"``, or None (size mode: Chinchilla)."""
    mfu: float | None = None
    tflops_per_gpu: float | None = None
    full_recompute: bool = False
    seq_len: int | None = None
    precision: str | None = None


def parse_tokens(text: str | None) -> float | str | None:
    """``300b`` -> 3e11, ``chinchilla`` -> ``"chinchilla"``; anything else is an InputError."""
    if text is None:
        return None
    if text.strip().lower() == CHINCHILLA:
        return CHINCHILLA
    try:
        return parse_count(text, what="--tokens")
    except InputError:
        raise InputError(f"invalid --tokens {text!r}: expected a count such as 300b or 1.4t, "
                         "or 'chinchilla' (~20 tokens per parameter)") from None


def _positive(name: str, value: float | None, most: int | None = None) -> None:
    if value is None:
        return
    if most is not None and value > most:
        raise InputError(f"invalid {name} {shown(value)}: must be at most {most}")
    if value <= 0 or not math.isfinite(value):
        raise InputError(f"invalid {name} {shown(value)}: must be a number greater than zero")


def request_mode(req: BaseRequest) -> str:
    """``size`` when a size or one specific model is given (and no --days), else ``budget``."""
    if req.size is not None:
        return "size"
    if req.days is None and names_one_model(req.model):
        return "size"
    return "budget"


def _validate(req: BaseRequest) -> None:
    _positive("--nodes", req.nodes, MAX_COUNT)
    _positive("--gpus-per-node", req.gpus_per_node, MAX_COUNT)
    _positive("--days", req.days)
    _positive("--seq-len", req.seq_len, MAX_SEQ_LEN)
    if req.precision is not None and req.precision not in PRECISIONS:
        raise InputError(f"invalid precision {req.precision!r}: allowed are "
                         f"{', '.join(PRECISIONS)}")
    if request_mode(req) == "budget":
        missing = [flag for flag, value in (("--gpu", req.gpu), ("--nodes or --gpus", req.nodes),
                                            ("--days", req.days), ("--tokens", req.tokens))
                   if value is None]
        if missing:
            raise InputError(f"budget mode needs {', '.join(missing)} (or give --size for a "
                             "fixed model size)")
    else:
        if req.days is not None:
            raise InputError("--days is for budget mode (no --size); with --size the days "
                             "are computed from the cluster")
        if (req.gpu is None) != (req.nodes is None):
            raise InputError("training days need both --gpu and --nodes (or --gpus)")


def _rate(req: BaseRequest, precision: str) -> ComputeRate | None:
    if req.gpu is None:
        return None
    return compute_rate(req.gpu, req.nodes * req.gpus_per_node, precision, req.full_recompute,
                        req.mfu, req.tflops_per_gpu)


def _model_and_tokens(req: BaseRequest, rate: ComputeRate | None, seq_len: int | None
                      ) -> tuple[ModelSpec, float, str, str]:
    """(model, tokens, how the model was chosen, how the tokens were chosen)."""
    ratio = float(heuristic("scaling", "chinchilla_tokens_per_param").value)
    chinchilla_why = f"Chinchilla: {ratio:g} tokens per parameter (Hoffmann et al. 2022)"
    if request_mode(req) == "size":
        model, why = resolve_sized_model(req.model, req.size)
        model = _with_seq_len(model, seq_len)
        if req.tokens is None or req.tokens == CHINCHILLA:
            reason = chinchilla_why if req.tokens else f"no --tokens: {chinchilla_why}"
            return model, ratio * total_params(model), why, reason
        return model, float(req.tokens), why, "given (--tokens)"
    template = _with_seq_len(family_template(req.model), seq_len)
    rule = shape_rule()
    if req.tokens == CHINCHILLA:
        target = max_params_chinchilla(req.days, ratio, rate)
        model = shape_for_params(target, template, rule)
        tokens = ratio * total_params(model)
        token_why = chinchilla_why
    else:
        tokens = float(req.tokens)
        target = max_params_for_tokens(req.days, tokens, rate)
        model = shape_for_params(target, template, rule)
        token_why = "given (--tokens)"
    why = (f"largest {template.family or template.name} shape with {rate.formula} <= budget "
           f"(at most {format_count(target)} params): {describe_rule(rule)}")
    return model, tokens, why, token_why


def _with_seq_len(model: ModelSpec, seq_len: int | None) -> ModelSpec:
    return model if seq_len is None else replace(model, seq_len=int(seq_len))


def _hp(key: str) -> Sourced:
    return heuristic("hyperparameters", key)


def _batch_and_lr(model: ModelSpec, params: int, seq_len: int
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """Global batch (sequences) and peak LR from the GPT-3 table, with rationale;
    a catalog model's own published batch wins over the table's."""
    table = gpt3_table()
    granule = int(_hp("batch_granule_sequences").value)
    batch_tok = table_batch_tokens(params, table)
    row = table_row(params, table)
    how = (f"row {format_count(table.params[row])}" if row is not None
           else "log-log interpolated by params")
    values = {"global_batch_size": batch_sequences(batch_tok, seq_len, granule),
              "lr": table_lr(params, table)}
    why = {"global_batch_size": (f"{format_count(batch_tok)} tokens (GPT-3 Table 2.1, {how}) / "
                                 f"{seq_len} = {batch_tok / seq_len:.1f} sequences, to a multiple "
                                 f"of {granule}: " + _hp("batch_granule_sequences").source),
           "lr": f"GPT-3 Table 2.1 learning rate ({how}): {table.source}"}
    published = published_batch(model, seq_len)
    if published is not None:
        values["global_batch_size"] = published
        why["global_batch_size"] = (f"{model.name}'s published training batch "
                                    f"(configs/models/{model.name}.yaml cites it)")
    return values, why


def _schedule(lr: float, tokens: float, tokens_per_step: int
              ) -> tuple[dict[str, Any], dict[str, str]]:
    """Min LR, warm-up, decay and step counts (GPT-3 Appendix B), with rationale."""
    min_frac = float(_hp("min_lr_fraction").value)
    warmup_tokens = float(_hp("warmup_tokens").value)
    decay_frac = float(_hp("decay_tokens_fraction").value)
    values = {"min_lr": lr * min_frac, "lr_decay_style": str(_hp("decay_style").value),
              "lr_warmup_steps": steps_for(warmup_tokens, tokens_per_step),
              "lr_decay_steps": steps_for(decay_frac * tokens, tokens_per_step),
              "train_steps": steps_for(tokens, tokens_per_step)}
    why = {"min_lr": f"{min_frac:g} x lr: {_hp('min_lr_fraction').source}",
           "lr_decay_style": _hp("decay_style").source,
           "lr_warmup_steps": (f"{format_count(warmup_tokens)} tokens / "
                               f"{format_count(tokens_per_step)} per step: "
                               + _hp("warmup_tokens").source),
           "lr_decay_steps": (f"{decay_frac:g} of the training tokens: "
                              + _hp("decay_tokens_fraction").source),
           "train_steps": "tokens / (global batch x sequence length)"}
    return values, why


def _published(model: ModelSpec, values: dict[str, Any], why: dict[str, str],
               tokens_given: bool) -> None:
    """Put the model's own published schedule (``catalog.published_schedule``: LR,
    warm-up, decay, optimizer, clipping, init, training tokens) over the table's
    values, each with the source its catalog file gives. Given --tokens stay."""
    schedule = published_schedule(model)
    tokens_per_step = values["global_batch_size"] * values["seq_len"]
    for key, (value, source) in schedule.items():
        if key == "tokens":
            if tokens_given:
                continue
            values["tokens"] = tokens = _number(value, key, model)
            values["train_steps"] = steps_for(tokens, tokens_per_step)
            decay = float(_hp("decay_tokens_fraction").value)
            values["lr_decay_steps"] = steps_for(decay * tokens, tokens_per_step)
            k = int(values["flops_formula"].rstrip("NT"))
            values["total_flops"] = k * active_params(model) * tokens
        elif key == "lr_warmup_tokens":
            warmup = _number(value, key, model)
            key, value = "lr_warmup_steps", steps_for(warmup, tokens_per_step)
            source = f"{format_count(warmup)} tokens: {source}"
        elif key == "lr_decay_style":
            value = str(value)
        else:
            value = _number(value, key, model)
            value = int(value) if key == "lr_warmup_steps" else value
        values[key] = value
        why[key] = f"{model.name}'s published schedule: {source}"


def _number(value, key: str, model: ModelSpec) -> float:
    """A published schedule's number (YAML reads 14.8e12 without a sign as text)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not number > 0 or number == float("inf"):
        raise CatalogError(f"configs/models/{model.name}.yaml: published_schedule {key} "
                           f"{value!r} is not a positive number")
    return number


def _optimizer_and_init(hidden: int) -> tuple[dict[str, Any], dict[str, str]]:
    """Adam, weight decay, clipping, init std and dropout, each with its source."""
    keys = {"weight_decay": "weight_decay", "adam_beta1": "adam_beta1",
            "adam_beta2": "adam_beta2", "adam_eps": "adam_eps", "clip_grad": "clip_grad",
            "hidden_dropout": "dropout", "attention_dropout": "dropout"}
    values = {field: float(_hp(key).value) for field, key in keys.items()}
    why = {field: _hp(key).source for field, key in keys.items()}
    numerator = _hp("init_std_numerator")
    values["init_method_std"] = init_std(hidden, float(numerator.value))
    why["init_method_std"] = f"sqrt({numerator.value}/hidden): {numerator.source}"
    return values, why


def _cluster_fields(req: BaseRequest, rate: ComputeRate, params: int, tokens: float
                    ) -> tuple[dict[str, Any], dict[str, str]]:
    """Cluster, utilisation and the days of this exact model (the inverse solve)."""
    days = training_days(params, tokens, rate)
    values = {"days": days, "utilisation": rate.utilisation,
              "utilisation_kind": rate.utilisation_kind, "peak_tflops_per_gpu": rate.peak_tflops,
              "gpu_name": req.gpu.name, "nodes": req.nodes, "gpus_per_node": req.gpus_per_node}
    kind = rate.utilisation_kind.upper()
    why = {"utilisation": f"{kind} {rate.utilisation:.3g}: {rate.utilisation_source}",
           "days": (f"{rate.formula} / ({rate.num_gpus} GPUs x {rate.peak_tflops:g} TFLOP/s x "
                    f"{rate.utilisation:.3g} {kind})")}
    if req.days is not None:
        values["budget_days"] = float(req.days)
        why["budget_days"] = "given (--days)"
        why["days"] += f"; {100 * days / req.days:.2f}% of the budget"
    return values, why


def make_base(req: BaseRequest) -> BaseConfig:
    """Solve the request: size -> days, or budget -> largest size; then hyper-parameters."""
    _validate(req)
    precision = req.precision or str(_hp("precision").value)
    rate = _rate(req, precision)
    model, tokens, model_why, tokens_why = _model_and_tokens(req, rate, req.seq_len)
    if req.tokens is None and "tokens" in published_schedule(model):
        value, source = published_schedule(model)["tokens"]
        tokens, tokens_why = _number(value, "tokens", model), f"{model.name}'s published: {source}"
    params = total_params(model)
    k = (rate.flops_per_param_token if rate
         else int(heuristic("scaling", "flops_per_param_token").value))
    formula_key = "flops_per_param_token_full_recompute" if k == 8 else "flops_per_param_token"
    values: dict[str, Any] = {"model": model, "seq_len": model.seq_len, "precision": precision,
                              "mode": request_mode(req), "params": params, "tokens": tokens,
                              "flops_formula": f"{k}NT",
                              "total_flops": k * active_params(model) * tokens}
    why = {"model": model_why, "params": "exact count of the shape (autoconfig.core.model.total_params)",
           "tokens": tokens_why,
           "seq_len": "given (--seq-len)" if req.seq_len else f"default of {model.name}'s family",
           "precision": "given (--precision)" if req.precision else _hp("precision").source,
           "flops_formula": f"C = {k} N T: " + heuristic("scaling", formula_key).source}
    batch, batch_why = _batch_and_lr(model, params, model.seq_len)
    parts = [(batch, batch_why),
             _schedule(batch["lr"], tokens, batch["global_batch_size"] * model.seq_len),
             _optimizer_and_init(model.hidden_size)]
    if rate is not None:
        # An MoE model's FLOPs follow the parameters a token passes through.
        parts.append(_cluster_fields(req, rate, active_params(model), tokens))
    for part_values, part_why in parts:
        values.update(part_values)
        why.update(part_why)
    _published(model, values, why, tokens_given=True)
    # The model trains with the dropout recommended here, so memory and search
    # downstream count (or skip) dropout masks accordingly.
    values["model"] = replace(model, hidden_dropout=values["hidden_dropout"],
                              attention_dropout=values["attention_dropout"])
    values.setdefault("gpu_name", None)
    values.setdefault("nodes", None)
    values.setdefault("gpus_per_node", None)
    return BaseConfig(rationale=tuple(why.items()), **values)


def base_for_model(model: ModelSpec, precision: str | None = None) -> BaseConfig:
    """``autoconfig base``'s defaults for an already resolved model (size mode, no
    cluster, Chinchilla tokens): what the launch outputs use when no base.yaml is
    given. The model keeps its own dropout (the search predicted with it)."""
    ratio = float(heuristic("scaling", "chinchilla_tokens_per_param").value)
    params = total_params(model)
    tokens = ratio * params
    k = int(heuristic("scaling", "flops_per_param_token").value)
    values: dict[str, Any] = {"model": model, "seq_len": model.seq_len,
                              "precision": precision or str(_hp("precision").value),
                              "mode": "size", "params": params, "tokens": tokens,
                              "flops_formula": f"{k}NT",
                              "total_flops": k * active_params(model) * tokens,
                              "gpu_name": None, "nodes": None, "gpus_per_node": None}
    why = {"model": f"{model.name} as searched", "tokens": f"Chinchilla: {ratio:g} tokens per "
           "parameter (Hoffmann et al. 2022)"}
    batch, batch_why = _batch_and_lr(model, params, model.seq_len)
    for part_values, part_why in ((batch, batch_why),
                                  _schedule(batch["lr"], tokens,
                                            batch["global_batch_size"] * model.seq_len),
                                  _optimizer_and_init(model.hidden_size)):
        values.update(part_values)
        why.update(part_why)
    values["hidden_dropout"] = model.hidden_dropout
    values["attention_dropout"] = model.attention_dropout
    why["hidden_dropout"] = why["attention_dropout"] = f"{model.name}'s own (as searched)"
    _published(model, values, why, tokens_given=False)
    return BaseConfig(rationale=tuple(why.items()), **values)


# ---------------------------------------------------------------- YAML / JSON

_MODEL_KEYS = ("name", "family", "size", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
               "ffn_hidden_size", "vocab_size", "seq_len", "mlp_kind", "norm_kind",
               "position_embedding", "tied_embeddings", "has_bias", "hidden_dropout",
               "attention_dropout", "published_batch_tokens")
_TRAINING_KEYS = ("params", "tokens", "seq_len", "global_batch_size", "precision", "train_steps",
                  "flops_formula", "total_flops", "days", "budget_days", "utilisation",
                  "utilisation_kind", "peak_tflops_per_gpu")
_OPTIMIZER_KEYS = ("lr", "min_lr", "lr_decay_style", "lr_warmup_steps", "lr_decay_steps",
                   "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad",
                   "init_method_std", "hidden_dropout", "attention_dropout")
_OPTIONAL_KEYS = ("days", "budget_days", "utilisation", "utilisation_kind", "peak_tflops_per_gpu")


_LAYER_KEYS = ("kv_channels", "qk_norm", "attention_kind", "q_lora_rank", "kv_lora_rank",
               "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_experts", "moe_topk",
               "moe_ffn_hidden_size", "moe_shared_expert_ffn_hidden_size",
               "moe_first_dense_layers", "moe_layer_freq", "mtp_layers")
"""MoE, MLA and head-width fields: written only where they differ from a dense GQA model."""


def model_to_dict(m: ModelSpec) -> dict[str, Any]:
    defaults = {f.name: f.default for f in fields(ModelSpec)}
    return {"name": m.name, "family": m.family, "size": m.size_label,
            **{key: getattr(m, key) for key in _MODEL_KEYS[3:]},
            **{key: getattr(m, key) for key in _LAYER_KEYS if getattr(m, key) != defaults[key]}}


def base_to_dict(cfg: BaseConfig) -> dict[str, Any]:
    """Plain data (JSON/YAML-ready) that :func:`base_from_dict` reads back."""
    cluster = None
    if cfg.gpu_name is not None:
        cluster = {"gpu": cfg.gpu_name, "nodes": cfg.nodes, "gpus_per_node": cfg.gpus_per_node}
    return {
        "autoconfig_base": BASE_FORMAT_VERSION,
        "mode": cfg.mode,
        "model": model_to_dict(cfg.model),
        "cluster": cluster,
        "training": {key: getattr(cfg, key) for key in _TRAINING_KEYS},
        "optimizer": {key: getattr(cfg, key) for key in _OPTIMIZER_KEYS},
        **({"stack": cfg.stack} if cfg.stack else {}),
        "rationale": dict(cfg.rationale),
    }


def _section(data: dict, key: str, where: str, optional: bool = False) -> dict:
    value = data.get(key)
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise CatalogError(f"{where}: missing or malformed section {key!r} (is this a file "
                           "written by 'autoconfig base -o'?)")
    return value


def base_from_dict(data: dict[str, Any], where: str) -> BaseConfig:
    """Inverse of :func:`base_to_dict`; CatalogError names what is missing."""
    if data.get("autoconfig_base") != BASE_FORMAT_VERSION:
        raise CatalogError(f"{where}: not an autoconfig base file (expected "
                           f"'autoconfig_base: {BASE_FORMAT_VERSION}')")
    model = model_from_mapping(_section(data, "model", where), default_name="base", where=where)
    cluster = _section(data, "cluster", where, optional=True)
    training = _section(data, "training", where)
    optimizer = _section(data, "optimizer", where)
    values: dict[str, Any] = {}
    for key in _TRAINING_KEYS + _OPTIMIZER_KEYS:
        source = training if key in _TRAINING_KEYS else optimizer
        values[key] = source.get(key)
    missing = sorted(k for k, v in values.items() if v is None and k not in _OPTIONAL_KEYS)
    if missing:
        raise CatalogError(f"{where}: missing field(s) {', '.join(missing)}")
    for key in ("global_batch_size", "seq_len", "train_steps", "lr_warmup_steps", "lr_decay_steps"):
        if isinstance(values[key], bool) or not isinstance(values[key], int) or values[key] < 1:
            raise CatalogError(f"{where}: field {key!r} must be a positive integer, "
                               f"got {values[key]!r}")
    if values["precision"] not in PRECISIONS:
        raise CatalogError(f"{where}: precision {values['precision']!r} is not one of "
                           f"{', '.join(PRECISIONS)}")
    rationale = data.get("rationale") or {}
    return BaseConfig(
        model=model, mode=str(data.get("mode", "size")),
        gpu_name=cluster.get("gpu"), nodes=cluster.get("nodes"),
        gpus_per_node=cluster.get("gpus_per_node"),
        stack=str(data["stack"]) if data.get("stack") else None,
        rationale=tuple((str(k), str(v)) for k, v in rationale.items()), **values)


def base_yaml_text(cfg: BaseConfig) -> str:
    return yaml.safe_dump(base_to_dict(cfg), sort_keys=False, width=100)


def write_base_yaml(cfg: BaseConfig, path: Path) -> None:
    """Write atomically: a reader never sees half a file."""
    try:
        write_atomic(Path(path), base_yaml_text(cfg))
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None


def read_base_yaml(path: Path) -> BaseConfig:
    """Read what ``autoconfig base -o base.yaml`` wrote (CatalogError on a bad file)."""
    path = Path(path)
    return base_from_dict(load_yaml(path), where=str(path))
