"""Model shapes for sizes not in the catalog: the documented shape rule of
``heuristics/scaling.yaml`` applied to a family's architecture; for
encoder-decoder families (T5, mT5) the NeMo launcher's widths by size
(``heuristics/hyperparameters.yaml``) with equal encoder and decoder depth."""

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from pathlib import Path

from autoconfig.core.catalog import all_models, get_model, looks_like_path, model_from_yaml
from autoconfig.errors import InfeasibleError, InputError
from autoconfig.heuristics import load_heuristics, sourced_number, sourced_table
from autoconfig.core.model import ModelSpec, total_params
from autoconfig.units import format_count, parse_count


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
    # An MoE template keeps its leading dense layers and at least one MoE layer;
    # past them every layer adds the same parameters.
    least = template.moe_first_dense_layers + 1 if template.is_moe else 1
    while True:
        low = max(least, math.ceil(hidden / rule.aspect_max))
        high = math.floor(hidden / rule.aspect_min)
        try:
            one, two = (shape_with(template, hidden, n, rule) for n in (least, least + 1))
        except InputError:    # past what a model file may hold (hidden, ffn limits)
            raise InfeasibleError(
                f"the budget allows {format_count(target)} parameters, beyond the largest "
                f"{template.family or template.name} shape the rule builds (hidden "
                f"{hidden - rule.hidden_granule}): give fewer days or GPUs, more tokens, or "
                "pick a catalog model with --size") from None
        per_layer = total_params(two) - total_params(one)
        fixed = total_params(one) - least * per_layer
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



def _size_of(label: str) -> float | None:
    try:
        return parse_count(label, what="size")
    except InputError:  # labels such as 'tiny'
        return None


def names_one_model(name: str) -> bool:
    """True for a model YAML path or a catalog model name (not a multi-size family)."""
    if looks_like_path(name):
        return True
    try:
        get_model(name)
    except InputError:
        return False
    return True


def resolve_sized_model(name: str, size: str | None) -> tuple[ModelSpec, str]:
    """A catalog model (or user YAML), or for a family size not in the catalog
    the shape rule's closest model. Returns the model and how it was found."""
    if looks_like_path(name):
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
    template = family_template(key)
    if template.is_encoder_decoder:
        model = encoder_decoder_shape_for_params(wanted, template, shape_rule(), size)
        return model, (f"closest {key} shape to {size}: "
                       + describe_encoder_decoder(model, shape_rule()))
    model = shape_for_params(wanted, template, shape_rule(), at_most=False)
    return model, f"closest {key} shape to {size}: {describe_rule(shape_rule())}"


# ---------------------------------------------------------------- encoder-decoder (T5, mT5)

WIDTH_TABLES = {"t5": "t5_width_table", "mt5": "mt5_width_table"}
"""Encoder-decoder families whose widths by size heuristics/hyperparameters.yaml
states (the NeMo launcher's auto_configurator tables)."""


@dataclass(frozen=True)
class WidthRow:
    """One row of a width table: the widths of sizes up to ``max_params``."""

    max_params: float
    hidden: int
    heads: int
    ffn: int
    kv_channels: int


def width_table(family: str) -> tuple[WidthRow, ...]:
    """The family's rows, smallest size first (InputError for a family without one)."""
    key = WIDTH_TABLES.get(family)
    if key is None:
        raise InputError(f"no width table for encoder-decoder family {family!r}: autoconfig "
                         f"scales {', '.join(WIDTH_TABLES)} (the NeMo launcher's tables); catalog "
                         f"sizes: {catalog_sizes(family)}")
    rows, _ = sourced_table("hyperparameters", key,
                            ("max_params", "hidden", "heads", "ffn", "kv_channels"))
    return tuple(WidthRow(max_params=r["max_params"], hidden=int(r["hidden"]),
                          heads=int(r["heads"]), ffn=int(r["ffn"]),
                          kv_channels=int(r["kv_channels"]))
                 for r in sorted(rows, key=lambda r: r["max_params"]))


def catalog_sizes(family: str) -> str:
    """The family's catalog sizes, smallest first (for errors)."""
    return ", ".join(m.size_label for m in sorted(
        (m for m in all_models() if m.family == family), key=total_params))


def width_for(params: float, rows: tuple[WidthRow, ...]) -> WidthRow | None:
    """The row NeMo's tool takes for a size: the first whose bound is above it
    (the last bound inclusive, as the tool's 250B); None beyond the table."""
    for row in rows:
        if params < row.max_params:
            return row
    return rows[-1] if params <= rows[-1].max_params else None


def encoder_decoder_shape(template: ModelSpec, row: WidthRow, depth: int) -> ModelSpec:
    """The template's architecture (vocabulary, lengths, MLP, norms) at a row's
    widths with ``depth`` encoder and ``depth`` decoder layers (the tool sets
    both stacks alike). Multi-head attention as every T5 (kv heads = heads).
    The template's published batch is its own, not the new size's: dropped."""
    model = replace(template, num_layers=2 * depth, decoder_layers=depth,
                    hidden_size=row.hidden, num_heads=row.heads, num_kv_heads=row.heads,
                    ffn_hidden_size=row.ffn, kv_channels=row.kv_channels,
                    published_batch_tokens=None)
    label = format_count(total_params(model)).lower()
    return replace(model, name=f"{template.family or template.name}-{label}", size_label=label)


def _depth_preference(depth: int) -> int:
    """How early NeMo's auto_configurator tries an encoder depth (utils.py
    calculate_model_size_params: powers of two, then multiples of 16, of 2, of
    5, then any): higher is tried earlier."""
    if depth >= 2 and depth & (depth - 1) == 0:
        return 4
    return 3 if depth % 16 == 0 else 2 if depth % 2 == 0 else 1 if depth % 5 == 0 else 0


def _depths_between(template: ModelSpec, row: WidthRow, least: float, most: float
                    ) -> list[ModelSpec]:
    """Shapes of a row whose parameters lie in [least, most] (at least depth 1).
    Parameters are linear in depth, so two counts give every depth's."""
    one = total_params(encoder_decoder_shape(template, row, 1))
    pair = total_params(encoder_decoder_shape(template, row, 2)) - one
    shallowest = max(1, math.ceil((least - one) / pair) + 1)
    deepest = max(shallowest, math.floor((most - one) / pair) + 1)
    return [encoder_decoder_shape(template, row, depth)
            for depth in range(shallowest, deepest + 1)]


def encoder_decoder_shape_for_params(target: float, template: ModelSpec, rule: ShapeRule,
                                     size: str = "") -> ModelSpec:
    """The shape NeMo's tool gives a size: its row's widths, and the depth whose
    exact count is closest; among depths within the rule's fill tolerance the
    tool's depth order wins."""
    rows = width_table(template.family)
    row = width_for(target, rows)
    if row is None:
        raise InputError(f"no {template.family} shape for --size {size or format_count(target)}: "
                         f"the NeMo launcher's table stops at {format_count(rows[-1].max_params)}; "
                         f"catalog sizes: {catalog_sizes(template.family)}")

    def key(model: ModelSpec) -> tuple:
        miss = abs(math.log(total_params(model) / target))
        near = miss <= rule.fill_tolerance
        return (near, _depth_preference(model.decoder_layers) if near else 0, -miss)

    return max(_depths_between(template, row, 0, 2 * target), key=key)


def encoder_decoder_shape_for_budget(template: ModelSpec, cost: Callable[[ModelSpec], float],
                                     budget: float, rule: ShapeRule) -> ModelSpec:
    """The largest shape whose ``cost`` (training FLOPs) fits the budget, among
    the shapes each at the widths the table gives its own size; within the
    fill tolerance of the budget the tool's depth order wins."""
    rows = width_table(template.family)
    bounds = zip((0.0,) + tuple(r.max_params for r in rows), rows)
    shapes = [m for low, row in bounds for m in _depths_between(template, row, low, row.max_params)
              if width_for(total_params(m), rows) == row]
    fitting = [m for m in shapes if cost(m) <= budget]
    if not fitting:
        smallest = min(shapes, key=cost)
        raise InfeasibleError(
            f"the budget allows {budget:.3g} FLOPs, below the smallest {template.family} shape "
            f"({format_count(total_params(smallest))}: {cost(smallest):.3g} FLOPs): give more "
            "days, GPUs or fewer tokens")

    def key(model: ModelSpec) -> tuple:
        miss = math.log(budget / cost(model))
        near = miss <= rule.fill_tolerance
        return (near, _depth_preference(model.decoder_layers) if near else 0, -miss)

    return max(fitting, key=key)


def describe_encoder_decoder(model: ModelSpec, rule: ShapeRule) -> str:
    """The widths and depth of an encoder-decoder shape and where they come from."""
    return (f"hidden {model.hidden_size}, {model.num_heads} heads x {model.head_dim}, ffn "
            f"{model.ffn_hidden_size}: the NeMo launcher's widths for the size "
            f"(heuristics/hyperparameters.yaml {WIDTH_TABLES[model.family]}); "
            f"{model.encoder_layers} encoder = {model.decoder_layers} decoder layers (within "
            f"{100 * rule.fill_tolerance:g}% the launcher's depth order: powers of two, then "
            "multiples of 16, 2, 5)")
