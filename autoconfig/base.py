"""The base training config: model size and shape, tokens, days and
pre-training hyper-parameters, from either a model size or a compute budget.

Compute: C = k N T with N the exact parameter count, T training tokens and
k = 6 (Kaplan et al. 2020: forward 2N + backward 4N per token), rated against
model-FLOPs utilisation (MFU); or k = 8 with full activation recomputation
(one more forward, Narayanan et al. 2021 eq. 3), rated against hardware-FLOPs
utilisation (HFU). Days = C / (GPUs x peak x utilisation x 86400), and the
budget solve is its inverse: N = days x 86400 x rate / (k T), or with
Chinchilla tokens T = r N, N = sqrt(days x 86400 x rate / (k r)).

Every number comes from ``heuristics/*.yaml`` with its source; this module
only says how they combine.
"""

import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from autoconfig.catalog import all_models, get_model, model_from_mapping, model_from_yaml
from autoconfig.errors import CatalogError, InfeasibleError, InputError
from autoconfig.hardware import GPU
from autoconfig.heuristics import Sourced, heuristic, load_heuristics, sourced_number, sourced_table
from autoconfig.model import ModelSpec, layer_params, total_params
from autoconfig.plan import PRECISIONS
from autoconfig.units import format_count, parse_count
from autoconfig.yamlio import load_yaml

SECONDS_PER_DAY = 86400.0
BASE_FORMAT_VERSION = 1
CHINCHILLA = "chinchilla"


# ---------------------------------------------------------------- compute budget

@dataclass(frozen=True)
class ComputeRate:
    """How fast a cluster turns FLOPs of the stated formula into training."""

    num_gpus: int
    peak_tflops: float
    """Dense peak per GPU in the training precision."""
    utilisation: float
    """Fraction of peak achieved: MFU for the 6NT formula, HFU for 8NT."""
    utilisation_kind: str
    """``mfu`` or ``hfu``."""
    flops_per_param_token: int
    """k in C = k N T: 6, or 8 with full recompute."""
    utilisation_source: str = ""

    @property
    def flops_per_s(self) -> float:
        return self.num_gpus * self.peak_tflops * 1e12 * self.utilisation

    @property
    def formula(self) -> str:
        return f"{self.flops_per_param_token}NT"


def training_flops(params: float, tokens: float, rate: ComputeRate) -> float:
    """C = k N T (k = 6, or 8 with full recompute)."""
    return rate.flops_per_param_token * params * tokens


def training_days(params: float, tokens: float, rate: ComputeRate) -> float:
    """Wall-clock days to train ``params`` on ``tokens`` at ``rate``."""
    return training_flops(params, tokens, rate) / rate.flops_per_s / SECONDS_PER_DAY


def max_params_for_tokens(days: float, tokens: float, rate: ComputeRate) -> float:
    """Largest N with k N T <= days x rate: the inverse of :func:`training_days`."""
    return days * SECONDS_PER_DAY * rate.flops_per_s / (rate.flops_per_param_token * tokens)


def max_params_chinchilla(days: float, tokens_per_param: float, rate: ComputeRate) -> float:
    """Largest N with k N (r N) <= days x rate, T = r N tokens (Hoffmann et al. 2022)."""
    budget = days * SECONDS_PER_DAY * rate.flops_per_s
    return math.sqrt(budget / (rate.flops_per_param_token * tokens_per_param))


def default_utilisation(gpu_name: str, precision: str, full_recompute: bool) -> Sourced:
    """The published utilisation of ``heuristics/efficiency.yaml`` for this GPU."""
    data = load_heuristics("efficiency")
    gpus = data.get("gpus") or {}
    entry = gpus.get(gpu_name)
    if not isinstance(entry, dict):
        known = ", ".join(sorted(gpus))
        raise InputError(f"no default efficiency for GPU {gpu_name!r} (known: {known}): "
                         "pass --mfu or --tflops-per-gpu")
    where = f"heuristics/efficiency.yaml gpus.{gpu_name}"
    if full_recompute and precision == "bf16" and "hfu_full_recompute" in entry:
        return sourced_number(entry, "hfu_full_recompute", where)
    key = f"mfu_{precision}"
    if key not in entry:
        raise InputError(f"no default {precision} efficiency for GPU {gpu_name!r}: "
                         "pass --mfu or --tflops-per-gpu")
    # Without a measured full-recompute run the same fraction of peak is assumed.
    return sourced_number(entry, key, where)


def compute_rate(gpu: GPU, num_gpus: int, precision: str, full_recompute: bool,
                 mfu: float | None = None, tflops_per_gpu: float | None = None) -> ComputeRate:
    """The cluster's rate from a given MFU, a given TFLOP/s per GPU, or the default."""
    if mfu is not None and tflops_per_gpu is not None:
        raise InputError("give either --mfu or --tflops-per-gpu, not both")
    peak = gpu.peak_tflops(precision)
    kind = "hfu" if full_recompute else "mfu"
    if mfu is not None:
        if not math.isfinite(mfu) or not 0 < mfu <= 1:
            raise InputError(f"invalid --mfu {mfu}: must be a fraction in (0, 1], e.g. 0.4")
        util, source = mfu, "given (--mfu)"
    elif tflops_per_gpu is not None:
        if not math.isfinite(tflops_per_gpu) or not 0 < tflops_per_gpu <= peak:
            raise InputError(f"invalid --tflops-per-gpu {tflops_per_gpu}: must be in "
                             f"(0, {peak:g}], the {precision} peak of {gpu.name}")
        util, source = tflops_per_gpu / peak, f"given (--tflops-per-gpu {tflops_per_gpu:g})"
    else:
        default = default_utilisation(gpu.name, precision, full_recompute)
        util, source = float(default.value), default.source
    k = int(heuristic("scaling", "flops_per_param_token_full_recompute" if full_recompute
                      else "flops_per_param_token").value)
    return ComputeRate(num_gpus=num_gpus, peak_tflops=peak, utilisation=util,
                       utilisation_kind=kind, flops_per_param_token=k, utilisation_source=source)


# ---------------------------------------------------------------- model shape

@dataclass(frozen=True)
class ShapeRule:
    """How ``base`` shapes a model of a size not in the catalog (heuristics/scaling.yaml)."""

    head_dim: int
    heads_multiple: int
    """Preferred divisor of the head count (tensor-parallel sizes)."""
    aspect_target: float
    """hidden / layers aimed for."""
    aspect_min: float
    aspect_max: float
    ffn_multiple: int
    layers_multiple: int
    """Preferred divisor of the layer count (pipeline stages)."""
    fill_tolerance: float
    """Shapes within this fraction of the target size count as equally good."""

    @property
    def hidden_granule(self) -> int:
        return self.head_dim


def shape_rule() -> ShapeRule:
    def number(key: str) -> float:
        return sourced_number(load_heuristics("scaling"), key, "heuristics/scaling.yaml").value
    return ShapeRule(head_dim=int(number("head_dim")),
                     heads_multiple=int(number("heads_multiple_preferred")),
                     aspect_target=number("aspect_ratio_target"),
                     aspect_min=number("aspect_ratio_min"), aspect_max=number("aspect_ratio_max"),
                     ffn_multiple=int(number("ffn_multiple")),
                     layers_multiple=int(number("layers_multiple_preferred")),
                     fill_tolerance=number("shape_fill_tolerance"))


def describe_rule(rule: ShapeRule) -> str:
    return (f"head dim {rule.head_dim}, hidden/layers in [{rule.aspect_min:g}, "
            f"{rule.aspect_max:g}], within {100 * rule.fill_tolerance:g}% of the size prefer "
            f"heads % {rule.heads_multiple} == 0 and layers % {rule.layers_multiple} == 0 "
            "(heuristics/scaling.yaml)")


def family_template(name: str) -> ModelSpec:
    """The architecture a new size copies: the largest catalog model of the family
    (``gpt3`` -> GPT-3 175B: GeLU, LayerNorm, learned positions; ``llama3`` ->
    Llama 3 405B: SwiGLU, RMSNorm, RoPE, GQA), that of a named model, or a
    user's YAML file."""
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return model_from_yaml(Path(name))
    key = name.strip().lower()
    family = [m for m in all_models() if m.family == key]
    if not family:
        family_of = get_model(key).family  # unknown names raise InputError here
        family = [m for m in all_models() if m.family == family_of] or [get_model(key)]
    return max(family, key=total_params)


def _round_up(value: float, multiple: int) -> int:
    return int(math.ceil(value / multiple - 1e-9)) * multiple


def shape_with(template: ModelSpec, hidden: int, layers: int, rule: ShapeRule) -> ModelSpec:
    """A model of ``hidden`` x ``layers`` with the template's architecture.

    heads = hidden / head_dim; kv heads copied from a GQA template (kept a divisor
    of heads), else equal to heads; ffn = the template's ffn/hidden ratio times
    hidden, rounded up to the ffn multiple.
    """
    heads = hidden // rule.head_dim
    kv = heads
    if template.num_kv_heads < template.num_heads:
        kv = math.gcd(heads, template.num_kv_heads)
    ffn = _round_up(template.ffn_hidden_size / template.hidden_size * hidden, rule.ffn_multiple)
    model = replace(template, num_layers=layers, hidden_size=hidden, num_heads=heads,
                    num_kv_heads=kv, ffn_hidden_size=ffn)
    label = format_count(total_params(model)).lower()
    family = template.family or template.name
    return replace(model, name=f"{family}-{label}", size_label=label)


def _candidates(template: ModelSpec, target: float, rule: ShapeRule
                ) -> list[tuple[int, int, int]]:
    """Every (params, hidden, layers) of the rule up to twice the target:
    hidden a multiple of the granule, hidden/layers inside the aspect band.
    Params are linear in layers, so each width costs one exact count."""
    found = []
    hidden = rule.hidden_granule
    while True:
        low = max(1, math.ceil(hidden / rule.aspect_max))
        high = math.floor(hidden / rule.aspect_min)
        one = shape_with(template, hidden, 1, rule)
        per_layer = layer_params(one)
        fixed = total_params(one) - per_layer
        if fixed + low * per_layer > 2 * target:
            return found
        found += [(fixed + layers * per_layer, hidden, layers) for layers in range(low, high + 1)
                   if fixed + layers * per_layer <= 2 * target]
        hidden += rule.hidden_granule


def _divisibility(count: int, multiple: int) -> int:
    """The largest power of two up to ``multiple`` that divides ``count``: how many
    tensor- (heads) or pipeline- (layers) parallel sizes the shape allows."""
    best = 1
    while best * 2 <= multiple and count % (best * 2) == 0:
        best *= 2
    return best


def shape_for_params(target: float, template: ModelSpec, rule: ShapeRule,
                     at_most: bool = True) -> ModelSpec:
    """The shape of the template's architecture for ``target`` parameters: the
    largest not above it (``at_most``, the budget solve) or the closest to it.

    Rule (heuristics/scaling.yaml): head dim 128, so hidden is a multiple of
    128; hidden/layers within [aspect_min, aspect_max]. Among the shapes within
    ``fill_tolerance`` of the target, heads divisible by heads_multiple (tensor
    parallel sizes up to 8) win, then layers divisible by layers_multiple
    (pipeline sizes), then the size; if none is that close, the size decides.
    Ties go to the aspect ratio nearest aspect_target.
    """
    candidates = [c for c in _candidates(template, target, rule)
                  if not at_most or c[0] <= target]
    if not candidates:
        smallest = shape_with(template, rule.hidden_granule,
                              math.ceil(rule.hidden_granule / rule.aspect_max), rule)
        raise InfeasibleError(
            f"the budget allows only {format_count(target)} parameters, below the smallest "
            f"shape of the rule ({format_count(total_params(smallest))}: hidden "
            f"{smallest.hidden_size}, {smallest.num_layers} layers): give more days, GPUs "
            "or fewer tokens, or pick a catalog model with --size")

    def miss(c: tuple[int, int, int]) -> float:
        return abs(math.log(c[0] / target))

    def key(c: tuple[int, int, int]) -> tuple:
        near = miss(c) <= rule.fill_tolerance
        tp = _divisibility(c[1] // rule.head_dim, rule.heads_multiple) if near else 0
        pp = _divisibility(c[2], rule.layers_multiple) if near else 0
        aspect = abs(math.log(c[1] / c[2] / rule.aspect_target))
        return (near, tp, pp, -miss(c), -aspect)

    _, hidden, layers = max(candidates, key=key)
    return shape_with(template, hidden, layers, rule)


def _is_path(name: str) -> bool:
    return name.endswith((".yaml", ".yml")) or "/" in name


def _size_of(label: str) -> float | None:
    try:
        return parse_count(label, what="size")
    except InputError:  # labels such as 'tiny'
        return None


def names_one_model(name: str) -> bool:
    """True for a model YAML path or a catalog model name (not a multi-size family)."""
    if _is_path(name):
        return True
    try:
        get_model(name)
    except InputError:
        return False
    return True


def resolve_sized_model(name: str, size: str | None) -> tuple[ModelSpec, str]:
    """A catalog model (or user YAML), or for a family size not in the catalog
    the shape rule's closest model. Returns the model and how it was found."""
    if _is_path(name):
        if size is not None:
            raise InputError(f"--size {size} does not apply to the model file {name}: "
                             "its shape is in the file")
        return get_model(name), f"model file {name}"
    if size is None:
        model = get_model(name)
        return model, f"catalog model {model.name}"
    wanted = parse_count(size, what="size")
    key = name.strip().lower()
    family = [m for m in all_models() if m.family == key]
    if not family:
        return get_model(name, size), ""  # raises the catalog's unknown-model error
    for model in family:
        found = _size_of(model.size_label)
        if found is not None and math.isclose(found, wanted, rel_tol=1e-3):
            return model, f"catalog model {model.name}"
    model = shape_for_params(wanted, family_template(key), shape_rule(), at_most=False)
    return model, f"closest {key} shape to {size}: {describe_rule(shape_rule())}"


# ---------------------------------------------------------------- hyper-parameters

def interpolate_loglog(x: float, xs: tuple[float, ...], ys: tuple[float, ...]) -> float:
    """log y linear in log x between table points; clamped beyond both ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= x <= x1:
            if y0 == y1:  # flat segment: exactly the row value, no rounding noise
                return y0
            w = math.log(x / x0) / math.log(x1 / x0)
            return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))
    raise AssertionError("unreachable: xs must be sorted")


@dataclass(frozen=True)
class SizeTable:
    """The GPT-3 paper's learning rate and batch size by model size."""

    params: tuple[float, ...]
    lr: tuple[float, ...]
    batch_tokens: tuple[float, ...]
    match_tolerance: float
    source: str


def gpt3_table() -> SizeTable:
    rows, source = sourced_table("hyperparameters", "gpt3_table", ("params", "lr", "batch_tokens"))
    rows = sorted(rows, key=lambda r: r["params"])
    table = SizeTable(params=tuple(r["params"] for r in rows), lr=tuple(r["lr"] for r in rows),
                      batch_tokens=tuple(r["batch_tokens"] for r in rows),
                      match_tolerance=float(heuristic("hyperparameters",
                                                      "table_match_tolerance").value),
                      source=source)
    _check_monotone(table)
    return table


def _check_monotone(table: SizeTable) -> None:
    """Larger model: learning rate never higher, batch never smaller."""
    lr_rises = any(b > a for a, b in zip(table.lr, table.lr[1:]))
    batch_falls = any(b < a for a, b in zip(table.batch_tokens, table.batch_tokens[1:]))
    if lr_rises or batch_falls:
        raise CatalogError("heuristics/hyperparameters.yaml gpt3_table: learning rate must not "
                           "rise and batch size must not fall with model size")


def table_row(params: float, table: SizeTable) -> int | None:
    """Index of the row whose size is within the match tolerance, if any."""
    for index, row_params in enumerate(table.params):
        if abs(params / row_params - 1) <= table.match_tolerance:
            return index
    return None


def _table_value(params: float, table: SizeTable, column: tuple[float, ...]) -> float:
    """The row's value for a model within the match tolerance of a row (the
    paper's sizes are rounded), else log-log interpolation between rows,
    clamped beyond the table."""
    row = table_row(params, table)
    if row is not None:
        return column[row]
    return interpolate_loglog(params, table.params, column)


def table_lr(params: float, table: SizeTable) -> float:
    return _table_value(params, table, table.lr)


def table_batch_tokens(params: float, table: SizeTable) -> float:
    return _table_value(params, table, table.batch_tokens)


def batch_sequences(batch_tokens: float, seq_len: int, granule: int) -> int:
    """Tokens per step to sequences: the nearest multiple of ``granule`` (at least
    one granule when that is no more than twice the raw count), else the nearest
    power of two, so small batches at long sequences are not inflated."""
    raw = batch_tokens / seq_len
    if raw >= granule / 2:
        return max(granule, int(round(raw / granule)) * granule)
    return max(1, 2 ** int(round(math.log2(max(raw, 1.0)))))


def heuristic_global_batch_size(params: float, seq_len: int) -> int:
    """The GPT-3 table's batch for this size, in sequences of ``seq_len``, rounded to
    the batch granule: what ``autoconfig base`` proposes (for other commands)."""
    granule = int(heuristic("hyperparameters", "batch_granule_sequences").value)
    return batch_sequences(table_batch_tokens(params, gpt3_table()), seq_len, granule)


def init_std(hidden: int, numerator: float) -> float:
    """sqrt(2 / (5 h)) (Nguyen & Salazar 2019; Le Scao et al. 2022)."""
    return math.sqrt(numerator / hidden)


def steps_for(tokens: float, tokens_per_step: int) -> int:
    return max(1, math.ceil(tokens / tokens_per_step))


# ---------------------------------------------------------------- the config

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


def _positive(name: str, value: float | None) -> None:
    if value is not None and (not math.isfinite(value) or value <= 0):
        raise InputError(f"invalid {name} {value:g}: must be a number greater than zero")


def request_mode(req: BaseRequest) -> str:
    """``size`` when a size or one specific model is given (and no --days), else ``budget``."""
    if req.size is not None:
        return "size"
    if req.days is None and names_one_model(req.model):
        return "size"
    return "budget"


def _validate(req: BaseRequest) -> None:
    _positive("--nodes", req.nodes)
    _positive("--gpus-per-node", req.gpus_per_node)
    _positive("--days", req.days)
    _positive("--seq-len", req.seq_len)
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


def _batch_and_lr(params: int, seq_len: int) -> tuple[dict[str, Any], dict[str, str]]:
    """Global batch (sequences) and peak LR from the GPT-3 table, with rationale."""
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
    params = total_params(model)
    k = (rate.flops_per_param_token if rate
         else int(heuristic("scaling", "flops_per_param_token").value))
    formula_key = "flops_per_param_token_full_recompute" if k == 8 else "flops_per_param_token"
    values: dict[str, Any] = {"model": model, "seq_len": model.seq_len, "precision": precision,
                              "mode": request_mode(req), "params": params, "tokens": tokens,
                              "flops_formula": f"{k}NT", "total_flops": k * params * tokens}
    why = {"model": model_why, "params": "exact count of the shape (autoconfig.model.total_params)",
           "tokens": tokens_why,
           "seq_len": "given (--seq-len)" if req.seq_len else f"default of {model.name}'s family",
           "precision": "given (--precision)" if req.precision else _hp("precision").source,
           "flops_formula": f"C = {k} N T: " + heuristic("scaling", formula_key).source}
    batch, batch_why = _batch_and_lr(params, model.seq_len)
    parts = [(batch, batch_why),
             _schedule(batch["lr"], tokens, batch["global_batch_size"] * model.seq_len),
             _optimizer_and_init(model.hidden_size)]
    if rate is not None:
        parts.append(_cluster_fields(req, rate, params, tokens))
    for part_values, part_why in parts:
        values.update(part_values)
        why.update(part_why)
    values.setdefault("gpu_name", None)
    values.setdefault("nodes", None)
    values.setdefault("gpus_per_node", None)
    return BaseConfig(rationale=tuple(why.items()), **values)


# ---------------------------------------------------------------- YAML / JSON

_MODEL_KEYS = ("name", "family", "size", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
               "ffn_hidden_size", "vocab_size", "seq_len", "mlp_kind", "norm_kind",
               "position_embedding", "tied_embeddings", "has_bias")
_TRAINING_KEYS = ("params", "tokens", "seq_len", "global_batch_size", "precision", "train_steps",
                  "flops_formula", "total_flops", "days", "budget_days", "utilisation",
                  "utilisation_kind", "peak_tflops_per_gpu")
_OPTIMIZER_KEYS = ("lr", "min_lr", "lr_decay_style", "lr_warmup_steps", "lr_decay_steps",
                   "weight_decay", "adam_beta1", "adam_beta2", "adam_eps", "clip_grad",
                   "init_method_std", "hidden_dropout", "attention_dropout")
_OPTIONAL_KEYS = ("days", "budget_days", "utilisation", "utilisation_kind", "peak_tflops_per_gpu")


def model_to_dict(m: ModelSpec) -> dict[str, Any]:
    return {"name": m.name, "family": m.family, "size": m.size_label,
            **{key: getattr(m, key) for key in _MODEL_KEYS[3:]}}


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
        rationale=tuple((str(k), str(v)) for k, v in rationale.items()), **values)


def base_yaml_text(cfg: BaseConfig) -> str:
    return yaml.safe_dump(base_to_dict(cfg), sort_keys=False, width=100)


def write_base_yaml(cfg: BaseConfig, path: Path) -> None:
    try:
        Path(path).write_text(base_yaml_text(cfg))
    except OSError as exc:
        raise InputError(f"cannot write {path}: {exc.strerror}") from None


def read_base_yaml(path: Path) -> BaseConfig:
    """Read what ``autoconfig base -o base.yaml`` wrote (CatalogError on a bad file)."""
    path = Path(path)
    return base_from_dict(load_yaml(path), where=str(path))
