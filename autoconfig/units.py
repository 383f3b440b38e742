"""Parsing of human-written counts such as ``175b`` or ``300B`` tokens, and units."""

import math
import re

from autoconfig.errors import InputError

GIB = float(1 << 30)
"""Bytes in a GiB (what the memory figures, nvidia-smi and PyTorch's allocator report)."""

_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_COUNT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*$", re.IGNORECASE)


def parse_count(text: str, what: str = "value") -> float:
    """``'175b'`` -> 175e9; ``'1.3B'`` -> 1.3e9; ``'300e9'`` -> 3e11.

    Raises InputError naming the text and the allowed form.
    """
    match = _COUNT_RE.match(str(text))
    if not match:
        raise InputError(
            f"invalid {what} {text!r}: expected a positive number with an optional "
            "suffix k, m, b or t (e.g. 175b, 1.3b, 300b)")
    value = float(match.group(1)) * _SUFFIX[match.group(2).lower()]
    if not math.isfinite(value) or value <= 0:
        raise InputError(f"invalid {what} {text!r}: must be greater than zero")
    return value


def format_count(value: float) -> str:
    """175e9 -> '175B', 1.3e9 -> '1.3B', 125e6 -> '125M' (for tables)."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.4g}"


def optional_float(value) -> float | None:
    """``value`` as a float, or None when it is missing, not a number, or NaN
    (a blank CSV or JSON cell)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number
