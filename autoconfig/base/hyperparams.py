"""Pre-training hyper-parameters by model size: the GPT-3 paper's table of
learning rate and batch size, interpolated in log space, and the batch in
sequences rounded to a granule that common data-parallel sizes divide; for
encoder-decoder models (T5, mT5) the NeMo launcher's batch by size."""

import math
from dataclasses import dataclass

from autoconfig.core.model import ModelSpec, total_params
from autoconfig.errors import CatalogError
from autoconfig.heuristics import heuristic, sourced_table
from autoconfig.units import format_count


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


def published_batch(model, seq_len: int) -> int | None:
    """The model's own published batch in sequences of ``seq_len`` (at least one)."""
    if model.published_batch_tokens is None:
        return None
    return max(1, round(model.published_batch_tokens / seq_len))


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


def t5_batch(params: float) -> tuple[int, str]:
    """The NeMo launcher's T5/mT5 global batch for a size, in samples, and why
    (a model beyond the table, 250B, gets its last row)."""
    rows, source = sourced_table("hyperparameters", "t5_batch_table", ("max_params", "samples"))
    rows = sorted(rows, key=lambda r: r["max_params"])
    row = next((r for r in rows if params <= r["max_params"]), rows[-1])
    samples = int(row["samples"])
    return samples, f"{samples} samples for {format_count(params)} parameters: {source}"


def default_global_batch_size(model: ModelSpec, seq_len: int) -> int:
    """The batch `autoconfig base` chooses: the model's published batch where its
    catalog file states one, else the GPT-3 paper's batch tokens by model size
    in sequences of seq_len (an encoder-decoder: the launcher's T5 samples)."""
    published = published_batch(model, seq_len)
    if published is not None:
        return published
    if model.is_encoder_decoder:
        return t5_batch(total_params(model))[0]
    return heuristic_global_batch_size(total_params(model), seq_len)
