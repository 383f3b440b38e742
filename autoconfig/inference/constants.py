"""The serving-side numbers of heuristics/inference.yaml, checked as they are read."""

import math
from functools import lru_cache

from autoconfig.errors import CatalogError
from autoconfig.heuristics import heuristics_path, load_heuristics, sourced_number


def inference_constant(key: str, unit: str, whole: bool = False) -> float:
    """The number ``key`` of heuristics/inference.yaml, which must be >= 0 (and
    whole where ``whole``); CatalogError naming the file, the field and ``unit``.
    Not cached: its callers cache what they read."""
    where = str(heuristics_path("inference"))
    value = float(sourced_number(load_heuristics("inference"), key, where).value)
    if not (math.isfinite(value) and value >= 0.0) or (whole and not value.is_integer()):
        kind = "a whole number" if whole else unit
        raise CatalogError(f"{where}: field {key!r} value {value!r} must be {kind} >= 0")
    return value


@lru_cache(maxsize=None)
def fp8_attention_speedup() -> float:
    """How much faster FP8 context attention runs than BF16 (heuristics/inference.yaml)."""
    value = inference_constant("fp8_attention_speedup", "a speed-up")
    if value <= 0.0:
        raise CatalogError(f"{heuristics_path('inference')}: fp8_attention_speedup {value} "
                           "must be > 0")
    return value
