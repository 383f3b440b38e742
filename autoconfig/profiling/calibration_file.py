"""A calibration file's fields (``autoconfig calibrate`` writes them,
``--calibration FILE`` reads them), each checked before a prediction uses it.

Apart from the fit (``autoconfig.validation.calibration``): the model's
fingerprint covers the fit's code, and a change to how a file is read must not
make every calibration written before it stale.
"""

import math

from autoconfig.errors import shown

DEVICES = ("cuda", "cpu")
"""Where a calibration's measurements ran (``profiling.calibrate.device_of``)."""


def file_fields(data: dict, keys, bounds: dict) -> dict:
    """The ``Calibration`` fields of a calibration file's mapping (as
    ``profiling.calibrate.write_calibration`` writes it), each checked: a
    ValueError with one line naming the field and what it must be, never a bare
    KeyError 'gpu'. Constants are only ``keys`` (what ``calibrate`` fits), each
    within ``bounds``, the ranges the fit itself keeps to: so a hand-edited or
    damaged file never puts -5, 1e300 or NaN into a prediction."""
    gpu = _text(data, "gpu", "the catalog name of the GPU it was fitted on")
    device = _text(data, "device", " or ".join(DEVICES))
    if device not in DEVICES:
        raise ValueError(f"field 'device' {shown(device)} must be {' or '.join(DEVICES)}")
    fingerprint = _text(data, "model_fingerprint", "the model fingerprint calibrate wrote")
    entries = data.get("constants")
    if not isinstance(entries, list):
        raise ValueError(f"field 'constants' must be a list of {{key, value, shipped}} entries, "
                         f"got {shown(entries)}")
    values, defaults = file_constants(entries, keys, bounds)
    residuals = data.get("residuals_pct") or {}
    if not isinstance(residuals, dict):
        raise ValueError(f"field 'residuals_pct' must map before and after to percents, "
                         f"got {shown(residuals)}")
    records = data.get("records") or []
    if not isinstance(records, list):
        raise ValueError(f"field 'records' must be a list of measured plans, got {shown(records)}")
    return {"values": values, "defaults": defaults, "gpu": gpu, "device": device,
            "records": tuple(records), "fingerprint": fingerprint,
            "before_pct": _number(residuals.get("before", math.nan), "residuals_pct before", None),
            "after_pct": _number(residuals.get("after", math.nan), "residuals_pct after", None)}


def file_constants(entries: list, keys, bounds: dict) -> tuple[dict, dict]:
    """({key: value}, {key: shipped value}) of a calibration file's ``constants``
    entries ``{key: [name, ...], value: N, shipped: N}``: each key one of ``keys``
    and given once, each value a finite number within ``bounds[key[0]]`` (both
    ends allowed), each shipped value finite. ValueError naming the constant."""
    values, defaults = {}, {}
    for index, entry in enumerate(entries, 1):
        if not isinstance(entry, dict):
            raise ValueError(f"constant {index} must be a mapping with key, value and shipped, "
                             f"got {shown(entry)}")
        key = _constant_key(entry, index, keys)
        if key in values:
            raise ValueError(f"constant {_dotted(key)} is given twice")
        for field in ("value", "shipped"):
            if field not in entry:
                raise ValueError(f"constant {_dotted(key)} has no {field!r} (a number)")
        values[key] = _number(entry["value"], f"constant {_dotted(key)} value", bounds[key[0]])
        defaults[key] = _number(entry["shipped"], f"constant {_dotted(key)} shipped")
    return values, defaults


def _constant_key(entry: dict, index: int, keys) -> tuple[str, ...]:
    """An entry's ``key``, a list of names such as [gemm_efficiency_max, hopper],
    as one of ``keys``: any other would be a constant no prediction reads (an
    unknown GPU generation) or no constant at all."""
    if "key" not in entry:
        raise ValueError(f"constant {index} has no 'key' (a list of names, e.g. "
                         "[gemm_efficiency_max, hopper])")
    raw = entry["key"]
    key = tuple(raw) if isinstance(raw, list) and all(isinstance(p, str) for p in raw) else None
    if key not in keys:
        given = _dotted(key) if key else shown(raw)
        raise ValueError(f"constant {index} key {given} is not one calibrate fits: allowed are "
                         f"{', '.join(_dotted(k) for k in keys)} (each a list of names)")
    return key


def _dotted(key: tuple[str, ...]) -> str:
    return ".".join(key)


def _text(data: dict, field: str, what: str) -> str:
    """A required text field (what it holds in ``what``)."""
    if data.get(field) is None:
        raise ValueError(f"missing field {field!r} ({what})")
    if not isinstance(data[field], str):
        raise ValueError(f"field {field!r} must be text ({what}), got {shown(data[field])}")
    return data[field]


def _number(raw, what: str, bounds: tuple[float, float] | None = (-math.inf, math.inf)) -> float:
    """``raw`` as a float, finite and within ``bounds`` (both ends allowed); any
    float where ``bounds`` is None (the residuals, NaN when a file lacks them).
    YAML reads 1e-3 (no dot) as text, so numeric text counts."""
    try:
        number = float(raw) if not isinstance(raw, bool) else None
    except (TypeError, ValueError, OverflowError):
        number = None
    if number is None:
        raise ValueError(f"{what} {shown(raw)} is not a number")
    if bounds is not None and not (math.isfinite(number) and bounds[0] <= number <= bounds[1]):
        low, high = bounds
        where = f" from {low:g} to {high:g}" if math.isfinite(low) and math.isfinite(high) else ""
        raise ValueError(f"{what} {shown(raw)} is out of range: must be a finite number{where}")
    return number
