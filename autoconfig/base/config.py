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
from autoconfig.bounds import COUNT, FRACTION, POSITIVE, SEQ_LEN, check_optional
from autoconfig.base.budget import (SECONDS_PER_DAY, ComputeRate, compute_rate,
                                    days_for_flops, flops_formula, flops_per_param_token,
                                    flops_per_token, max_params_chinchilla,
                                    max_params_for_tokens)
from autoconfig.core.catalog import all_models, families, model_from_mapping
from autoconfig.errors import CatalogError, InputError
from autoconfig.core.hardware import GPU
from autoconfig.heuristics import Sourced, heuristic
from autoconfig.base.hyperparams import (batch_sequences, gpt3_table, init_std, published_batch,
                                         steps_for, t5_batch, table_batch_tokens, table_lr,
                                         table_row)
from autoconfig.core.catalog import published_schedule
from autoconfig.core.model import ModelSpec, total_params
from autoconfig.core.plan import PRECISIONS
from autoconfig.base.shape import (describe_encoder_decoder, describe_rule,
                                   encoder_decoder_shape_for_budget, family_template,
                                   names_one_model, resolve_sized_model, shape_for_params,
                                   shape_rule, width_for, width_table)
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
    """Tokens per sequence (encoder-decoder: the encoder's, the tokens counted)."""
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
    """``6NT`` (model FLOPs, rated by MFU) or ``8NT`` (full recompute, rated by HFU);
    for an encoder-decoder ``FT`` or ``4FT/3`` (F: its FLOPs per encoder token)."""
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


def request_mode(req: BaseRequest) -> str:
    """``size`` when a size or one specific model is given (and no --days), else ``budget``."""
    if req.size is not None:
        return "size"
    if req.days is None and names_one_model(req.model):
        return "size"
    return "budget"


def _validate(req: BaseRequest) -> None:
    check_optional("--nodes", req.nodes, COUNT)
    check_optional("--gpus-per-node", req.gpus_per_node, COUNT)
    check_optional("--days", req.days, POSITIVE)
    # Checked here, GPU or not; the peak that bounds --tflops-per-gpu is checked
    # with the GPU (budget.compute_rate).
    check_optional("--tflops-per-gpu", req.tflops_per_gpu, POSITIVE)
    check_optional("--mfu", req.mfu, FRACTION)
    check_optional("--seq-len", req.seq_len, SEQ_LEN)
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
        family_tokens = _family_published_tokens(model) if req.tokens is None else None
        if family_tokens is not None:
            tokens, token_why = family_tokens
            return model, tokens, why, token_why
        if req.tokens is None or req.tokens == CHINCHILLA:
            chinchilla_why = _chinchilla_why(model, ratio)
            reason = chinchilla_why if req.tokens else f"no --tokens: {chinchilla_why}"
            return model, ratio * total_params(model), why, reason
        return model, float(req.tokens), why, "given (--tokens)"
    template = _with_seq_len(family_template(req.model), seq_len)
    if template.is_encoder_decoder:
        return _encoder_decoder_budget(req, rate, template, ratio)
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


def _chinchilla_why(model: ModelSpec, ratio: float) -> str:
    """Chinchilla's ratio; for an encoder-decoder said to be a decoder-only fit."""
    why = f"Chinchilla: {ratio:g} tokens per parameter (Hoffmann et al. 2022)"
    if model.is_encoder_decoder:
        why += (", fitted on decoder-only models, not a T5 result; counted here in encoder "
                "tokens")
    return why


def _family_published_tokens(model: ModelSpec) -> tuple[float, str] | None:
    """An encoder-decoder's default training tokens: its own published count,
    else its family's largest catalog model's (the NeMo launcher trains every
    T5 and mT5 size on the same ~1.05T encoder tokens); None for decoder-only
    models (Chinchilla) and families without one."""
    if not model.is_encoder_decoder:
        return None
    template = _catalog_template(model)
    for candidate in [model] + ([template] if template else []):
        schedule = published_schedule(candidate)
        if "tokens" in schedule:
            value, source = schedule["tokens"]
            return (_number(value, "tokens", candidate),
                    f"{candidate.name}'s published: {source} (encoder tokens)")
    return None


def _encoder_decoder_budget(req: BaseRequest, rate: ComputeRate, template: ModelSpec,
                            ratio: float) -> tuple[ModelSpec, float, str, str]:
    """The largest shape of an encoder-decoder family whose C = F T fits the
    budget, F its own FLOPs per encoder token (not 6N)."""
    budget = req.days * SECONDS_PER_DAY * rate.flops_per_s
    chinchilla = req.tokens == CHINCHILLA

    def tokens_of(model: ModelSpec) -> float:
        return ratio * total_params(model) if chinchilla else float(req.tokens)

    def cost(model: ModelSpec) -> float:
        return flops_per_token(model, rate.full_recompute) * tokens_of(model)

    rule = shape_rule()
    model = encoder_decoder_shape_for_budget(template, cost, budget, rule)
    why = (f"largest {template.family} shape with {flops_formula(model, rate.full_recompute)} "
           f"<= budget ({budget:.4g} FLOPs; F its FLOPs per encoder token): "
           + describe_encoder_decoder(model, rule))
    rows = width_table(template.family)
    if width_for(total_params(model), rows) == rows[-1] and cost(model) < budget / math.exp(
            rule.fill_tolerance):
        why += (f"; the launcher's table stops at {format_count(rows[-1].max_params)}, below "
                "what the budget allows")
    token_why = _chinchilla_why(model, ratio) if chinchilla else "given (--tokens)"
    return model, tokens_of(model), why, token_why


def _with_seq_len(model: ModelSpec, seq_len: int | None) -> ModelSpec:
    return model if seq_len is None else replace(model, seq_len=int(seq_len))


def _hp(key: str) -> Sourced:
    return heuristic("hyperparameters", key)


def _batch_and_lr(model: ModelSpec, params: int, seq_len: int
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """Global batch (sequences) and peak LR from the GPT-3 table (an encoder-
    decoder's from the NeMo launcher's rule), with rationale; a catalog model's
    own published batch wins over the table's."""
    if model.is_encoder_decoder:
        values, why = _encoder_decoder_batch_and_lr(params)
        return _published_batch(model, seq_len, values, why)
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
    return _published_batch(model, seq_len, values, why)


def _published_batch(model: ModelSpec, seq_len: int, values: dict[str, Any],
                     why: dict[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The model's own published batch over the rule's, where its file states one."""
    published = published_batch(model, seq_len)
    if published is not None:
        values["global_batch_size"] = published
        why["global_batch_size"] = (f"{model.name}'s published training batch "
                                    f"(configs/models/{model.name}.yaml cites it)")
    return values, why


def _encoder_decoder_batch_and_lr(params: int) -> tuple[dict[str, Any], dict[str, str]]:
    """The NeMo launcher's T5/mT5 batch by size (samples) and its one LR."""
    samples, batch_why = t5_batch(params)
    return ({"global_batch_size": samples, "lr": float(_hp("t5_lr").value)},
            {"global_batch_size": batch_why, "lr": _hp("t5_lr").source})


def _schedule(model: ModelSpec, lr: float, tokens: float, tokens_per_step: int
              ) -> tuple[dict[str, Any], dict[str, str]]:
    """Min LR, warm-up, decay and step counts (GPT-3 Appendix B; an encoder-
    decoder's the NeMo launcher's), with rationale."""
    if model.is_encoder_decoder:
        min_frac = float(_hp("t5_min_lr_fraction").value)
        # round(lr * 0.1, 8) as the launcher's auto_configurator writes min_lr
        values = {"min_lr": round(lr * min_frac, 8),
                  "lr_decay_style": str(_hp("t5_decay_style").value)}
        why = {"min_lr": f"{min_frac:g} x lr: {_hp('t5_min_lr_fraction').source}",
               "lr_decay_style": _hp("t5_decay_style").source}
    else:
        min_frac = float(_hp("min_lr_fraction").value)
        warmup_tokens = float(_hp("warmup_tokens").value)
        values = {"min_lr": lr * min_frac, "lr_decay_style": str(_hp("decay_style").value),
                  "lr_warmup_steps": steps_for(warmup_tokens, tokens_per_step)}
        why = {"min_lr": f"{min_frac:g} x lr: {_hp('min_lr_fraction').source}",
               "lr_decay_style": _hp("decay_style").source,
               "lr_warmup_steps": (f"{format_count(warmup_tokens)} tokens / "
                                   f"{format_count(tokens_per_step)} per step: "
                                   + _hp("warmup_tokens").source)}
    steps, steps_why = _step_counts(model, tokens, tokens_per_step)
    return {**values, **steps}, {**why, **steps_why}


def _step_counts(model: ModelSpec, tokens: float, tokens_per_step: int
                 ) -> tuple[dict[str, Any], dict[str, str]]:
    """What follows from the training tokens: train steps and decay steps
    (GPT-3: a fraction of the tokens); an encoder-decoder's warm-up and decay
    as fractions of the steps (NeMo's warmup_ratio, WarmupAnnealing)."""
    steps = steps_for(tokens, tokens_per_step)
    if not model.is_encoder_decoder:
        decay_frac = float(_hp("decay_tokens_fraction").value)
        return ({"lr_decay_steps": steps_for(decay_frac * tokens, tokens_per_step),
                 "train_steps": steps},
                {"lr_decay_steps": (f"{decay_frac:g} of the training tokens: "
                                    + _hp("decay_tokens_fraction").source),
                 "train_steps": "tokens / (global batch x sequence length)"})
    warmup, decay = _hp("t5_warmup_ratio"), _hp("t5_decay_steps_fraction")
    return ({"lr_warmup_steps": max(1, int(float(warmup.value) * steps)),
             "lr_decay_steps": steps_for(float(decay.value) * steps, 1), "train_steps": steps},
            {"lr_warmup_steps": f"{warmup.value:g} of the {steps} train steps: {warmup.source}",
             "lr_decay_steps": f"{decay.value:g} x the train steps: {decay.source}",
             "train_steps": ("encoder tokens / (global batch samples x encoder sequence "
                             "length), as the NeMo launcher's auto_configurator sets max_steps "
                             "(base_config.py generate_base_config)")})


def _fit_warmup(values: dict[str, Any], why: dict[str, str]) -> None:
    """Megatron-LM refuses a warm-up that reaches the decay
    (megatron/core/optimizer_param_scheduler.py: assert lr_warmup_steps <
    lr_decay_steps): a run shorter than its warm-up rule (GPT-3's 375M tokens,
    or a model's published steps) warms up over a share of its steps instead,
    the NeMo launcher's warmup_ratio."""
    warmup, decay = values.get("lr_warmup_steps"), values.get("lr_decay_steps")
    if warmup is None or decay is None or warmup < decay:
        return
    ratio = _hp("t5_warmup_ratio")
    values["lr_warmup_steps"] = min(decay - 1, max(1, int(float(ratio.value)
                                                         * values["train_steps"])))
    why["lr_warmup_steps"] = (f"{ratio.value:g} of the {values['train_steps']} train steps, "
                              f"below the {decay} decay steps (the run is shorter than "
                              f"{warmup} warm-up steps; Megatron-LM asserts warm-up < decay): "
                              + ratio.source)


def _published(model: ModelSpec, values: dict[str, Any], why: dict[str, str],
               tokens_given: bool, per_token_flops: float, skip: tuple[str, ...] = ()) -> None:
    """Put the model's own published schedule (``catalog.published_schedule``: LR,
    warm-up, decay, optimizer, clipping, init, training tokens) over the table's
    values, each with the source its catalog file gives. Given --tokens stay, as
    do the ``skip`` keys. The tokens go first: the step counts follow them."""
    schedule = published_schedule(model)
    tokens_per_step = values["global_batch_size"] * values["seq_len"]
    for key, (value, source) in sorted(schedule.items(), key=lambda item: item[0] != "tokens"):
        if key in skip:
            continue
        if key == "tokens":
            if tokens_given:
                continue
            values["tokens"] = tokens = _number(value, key, model)
            steps, steps_why = _step_counts(model, tokens, tokens_per_step)
            values.update(steps)
            why.update(steps_why)
            values["total_flops"] = per_token_flops * tokens
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


def _optimizer_and_init(model: ModelSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """Adam, weight decay, clipping, init std and dropout, each with its source
    (an encoder-decoder's from the NeMo launcher's T5 config: the t5_ entries)."""
    prefix = "t5_" if model.is_encoder_decoder else ""
    keys = {"weight_decay": "weight_decay", "adam_beta1": "adam_beta1",
            "adam_beta2": "adam_beta2", "adam_eps": "adam_eps", "clip_grad": "clip_grad",
            "hidden_dropout": "dropout", "attention_dropout": "dropout"}
    values = {field: float(_hp(prefix + key).value) for field, key in keys.items()}
    why = {field: _hp(prefix + key).source for field, key in keys.items()}
    if model.is_encoder_decoder:
        values["init_method_std"] = float(_hp("t5_init_method_std").value)
        why["init_method_std"] = _hp("t5_init_method_std").source
        return values, why
    numerator = _hp("init_std_numerator")
    values["init_method_std"] = init_std(model.hidden_size, float(numerator.value))
    why["init_method_std"] = f"sqrt({numerator.value}/hidden): {numerator.source}"
    return values, why


def _cluster_fields(req: BaseRequest, rate: ComputeRate, model: ModelSpec, flops: float,
                    formula: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Cluster, utilisation and the days of this exact model (the inverse solve)."""
    days = days_for_flops(flops, rate)
    values = {"days": days, "utilisation": rate.utilisation,
              "utilisation_kind": rate.utilisation_kind, "peak_tflops_per_gpu": rate.peak_tflops,
              "gpu_name": req.gpu.name, "nodes": req.nodes, "gpus_per_node": req.gpus_per_node}
    kind = rate.utilisation_kind.upper()
    source = rate.utilisation_source
    if model.is_encoder_decoder and req.mfu is None and req.tflops_per_gpu is None:
        source += (" [measured on decoder-only models: heuristics/efficiency.yaml has no "
                   "encoder-decoder run; give --mfu for one]")
    why = {"utilisation": f"{kind} {rate.utilisation:.3g}: {source}",
           "days": (f"{formula} / ({rate.num_gpus} GPUs x {rate.peak_tflops:g} TFLOP/s x "
                    f"{rate.utilisation:.3g} {kind})")}
    if req.days is not None:
        values["budget_days"] = float(req.days)
        why["budget_days"] = "given (--days)"
        why["days"] += f"; {100 * days / req.days:.2f}% of the budget"
    return values, why


def _formula_why(model: ModelSpec, full_recompute: bool) -> str:
    """Why C is what it is: k N T (Kaplan; Narayanan with recompute), or for an
    encoder-decoder its own FLOPs per encoder token."""
    if not model.is_encoder_decoder:
        k = flops_per_param_token(full_recompute)
        key = "flops_per_param_token_full_recompute" if full_recompute else "flops_per_param_token"
        return f"C = {k} N T: " + heuristic("scaling", key).source
    per_token = flops_per_token(model, full_recompute=False)
    share = per_token / (6 * total_params(model))
    why = (f"C = F T, F = {per_token:.4g} FLOPs per encoder token ({share:.2f} x 6N): "
           f"forward and backward of {model.encoder_layers} encoder layers over "
           f"{model.seq_len} tokens, {model.decoder_layers} decoder layers over "
           f"{model.decoder_seq_len} tokens with cross-attention to the {model.seq_len}, and "
           f"the logits of the {model.decoder_seq_len}, per encoder token "
           "(autoconfig.core.model.model_flops_per_token; 6N would charge the decoder for "
           "every encoder token)")
    if full_recompute:
        why = why.replace("C = F T", "C = 4/3 F T", 1) + (
            "; full recompute adds one forward of the three (Narayanan et al. 2021 eq. 3)")
    return why


def _catalog_template(model: ModelSpec) -> ModelSpec | None:
    """The largest catalog model of the model's family (what a scaled shape
    copies, ``shape.family_template``); None for a family the catalog lacks."""
    return family_template(model.family) if model.family in families() else None


def _architecture_origin(model: ModelSpec) -> str:
    """Where a model's lengths come from: its catalog file, its family's (a
    scaled shape keeps the family template's), or the user's model file."""
    if model.name in {m.name for m in all_models()}:
        return f"{model.name}'s (configs/models/{model.name}.yaml cites it)"
    template = _catalog_template(model)
    if template is not None:
        return (f"{template.name}'s, kept by the scaled shape (configs/models/"
                f"{template.name}.yaml cites it)")
    return "the model file's"


def _length_why(req: BaseRequest, model: ModelSpec) -> dict[str, str]:
    """Sequence lengths' sources: an encoder-decoder has two."""
    given = "given (--seq-len)" if req.seq_len else ""
    if not model.is_encoder_decoder:
        return {"seq_len": given or f"default of {model.name}'s family"}
    origin = _architecture_origin(model)
    return {"seq_len": given or f"encoder tokens per sample (the tokens counted): {origin}",
            "decoder_seq_len": f"decoder tokens per sample: {origin}"}


def _names_encoder_decoder(req: BaseRequest) -> bool:
    """Whether the request's model (or budget family) is an encoder-decoder."""
    if request_mode(req) == "budget":
        return family_template(req.model).is_encoder_decoder
    return resolve_sized_model(req.model, req.size)[0].is_encoder_decoder


def make_base(req: BaseRequest) -> BaseConfig:
    """Solve the request: size -> days, or budget -> largest size; then hyper-parameters."""
    _validate(req)
    # The precision sets the rate the budget solve needs, so it comes before the model.
    default_precision = _hp("t5_precision" if _names_encoder_decoder(req) else "precision")
    precision = req.precision or str(default_precision.value)
    rate = _rate(req, precision)
    model, tokens, model_why, tokens_why = _model_and_tokens(req, rate, req.seq_len)
    if req.tokens is None and not model.is_encoder_decoder \
            and "tokens" in published_schedule(model):
        value, source = published_schedule(model)["tokens"]
        tokens, tokens_why = _number(value, "tokens", model), f"{model.name}'s published: {source}"
    params = total_params(model)
    full_recompute = rate is not None and rate.full_recompute
    # An MoE model's FLOPs follow the parameters a token passes through; an
    # encoder-decoder's are its own count per encoder token.
    per_token = flops_per_token(model, full_recompute)
    formula = flops_formula(model, full_recompute)
    values: dict[str, Any] = {"model": model, "seq_len": model.seq_len, "precision": precision,
                              "mode": request_mode(req), "params": params, "tokens": tokens,
                              "flops_formula": formula, "total_flops": per_token * tokens}
    why = {"model": model_why, "params": "exact count of the shape (autoconfig.core.model.total_params)",
           "tokens": tokens_why, **_length_why(req, model),
           "precision": "given (--precision)" if req.precision else default_precision.source,
           "flops_formula": _formula_why(model, full_recompute)}
    batch, batch_why = _batch_and_lr(model, params, model.seq_len)
    parts = [(batch, batch_why),
             _schedule(model, batch["lr"], tokens, batch["global_batch_size"] * model.seq_len),
             _optimizer_and_init(model)]
    if rate is not None:
        parts.append(_cluster_fields(req, rate, model, values["total_flops"], formula))
    for part_values, part_why in parts:
        values.update(part_values)
        why.update(part_why)
    # A T5's published warm-up is 1% of its published steps: given --tokens, 1% of the new.
    skip = ("lr_warmup_steps",) if model.is_encoder_decoder and req.tokens is not None else ()
    _published(model, values, why, tokens_given=True, per_token_flops=per_token, skip=skip)
    _fit_warmup(values, why)
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
    cluster, Chinchilla tokens; an encoder-decoder its family's published tokens):
    what the launch outputs use when no base.yaml is given. The model keeps its
    own dropout (the search predicted with it)."""
    ratio = float(heuristic("scaling", "chinchilla_tokens_per_param").value)
    params = total_params(model)
    tokens, tokens_why = _family_published_tokens(model) or (
        ratio * params, _chinchilla_why(model, ratio))
    per_token = flops_per_token(model, full_recompute=False)
    default_precision = _hp("t5_precision" if model.is_encoder_decoder else "precision")
    values: dict[str, Any] = {"model": model, "seq_len": model.seq_len,
                              "precision": precision or str(default_precision.value),
                              "mode": "size", "params": params, "tokens": tokens,
                              "flops_formula": flops_formula(model, full_recompute=False),
                              "total_flops": per_token * tokens,
                              "gpu_name": None, "nodes": None, "gpus_per_node": None}
    why = {"model": f"{model.name} as searched", "tokens": tokens_why}
    batch, batch_why = _batch_and_lr(model, params, model.seq_len)
    for part_values, part_why in ((batch, batch_why),
                                  _schedule(model, batch["lr"], tokens,
                                            batch["global_batch_size"] * model.seq_len),
                                  _optimizer_and_init(model)):
        values.update(part_values)
        why.update(part_why)
    values["hidden_dropout"] = model.hidden_dropout
    values["attention_dropout"] = model.attention_dropout
    why["hidden_dropout"] = why["attention_dropout"] = f"{model.name}'s own (as searched)"
    _published(model, values, why, tokens_given=False, per_token_flops=per_token)
    _fit_warmup(values, why)
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
    # Without its decoder depth and length a T5 would read back as a decoder-only model.
    stacks = ({"encoder_layers": m.encoder_layers, "decoder_layers": m.decoder_layers,
               "decoder_seq_len": m.decoder_seq_len} if m.is_encoder_decoder else {})
    return {"name": m.name, "family": m.family, "size": m.size_label,
            **{key: getattr(m, key) for key in _MODEL_KEYS[3:]}, **stacks,
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
        least = 0 if key == "lr_warmup_steps" else 1   # no warm-up: a run of one decay step
        if isinstance(values[key], bool) or not isinstance(values[key], int) \
                or values[key] < least:
            raise CatalogError(f"{where}: field {key!r} must be an integer from {least}, "
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
