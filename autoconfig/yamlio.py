"""Reading sourced YAML: every number either is ``{value, source}`` or is
covered by a ``source:`` of the file (or of its section)."""

import math
from pathlib import Path
from typing import Any

import yaml

from autoconfig.errors import CatalogError, InputError
from autoconfig.textfile import read_text


SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser where PyYAML was built with it (its wheels are): the same safe
constructors and resolvers, parsing ~10x faster; every command reads the catalogs,
whose parsing was most of `infer`'s 2 s."""


def load_yaml(path: Path) -> dict[str, Any]:
    """Load one YAML mapping; a missing or malformed file is a CatalogError."""
    try:
        text = read_text(path, "YAML file")
    except InputError as exc:
        raise CatalogError(str(exc)) from None
    try:
        data = yaml.load(text, Loader=SAFE_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" line {where.line + 1}" if where is not None else ""
        raise CatalogError(f"malformed YAML in {path}{line}: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise CatalogError(f"malformed catalog file {path}: expected a mapping at top level")
    return data


def sourced_field(data: dict[str, Any], key: str, where: object) -> tuple[Any, str]:
    """``key: {value: ..., source: "..."}`` -> (value, source); the source is mandatory."""
    entry = data.get(key)
    if not isinstance(entry, dict) or "value" not in entry:
        raise CatalogError(f"{where}: field {key!r} must be a mapping with 'value' and 'source'")
    source = str(entry.get("source", "")).strip()
    if not source:
        raise CatalogError(f"{where}: field {key!r} has no source")
    return entry["value"], source


def sourced_number(data: dict[str, Any], key: str, path: Path, *,
                   optional: bool = False) -> float | None:
    """Read ``key: {value: N, source: "..."}``; the source is mandatory."""
    if data.get(key) is None:
        if optional:
            return None
        raise CatalogError(f"{path}: missing field {key!r}")
    value, _ = sourced_field(data, key, path)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CatalogError(f"{path}: field {key!r} value {value!r} is not a number")
    if not finite_number(value):
        raise CatalogError(f"{path}: field {key!r} value {value!r} is not a finite number")
    return value


def finite_number(value: Any) -> bool:
    """An int or float (not a bool) that a float holds finitely: YAML reads .nan
    and .inf as floats, which pass every ``<= 0`` check, and an int past 1e308
    overflows float()."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def require_source(data: dict[str, Any], path: Path) -> str:
    """A file-level ``source:`` that covers every number in the file."""
    source = str(data.get("source", "")).strip()
    if not source:
        raise CatalogError(f"{path}: missing top-level 'source' for its numbers")
    return source
