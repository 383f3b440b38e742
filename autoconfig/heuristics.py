"""Reading the sourced numbers in ``heuristics/*.yaml``.

Python decides how a heuristic is computed; these files say which numbers,
each as ``{value: X, source: "..."}`` (tables carry one ``source`` for all
their rows). Any module may use this loader for its own heuristics file.
"""

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from autoconfig.errors import CatalogError
from autoconfig.paths import heuristics_dir
from autoconfig.yamlio import finite_number, load_yaml, sourced_field


@dataclass(frozen=True)
class Sourced:
    """One heuristic value and the reference it comes from."""

    value: Any
    source: str


def heuristics_path(name: str) -> Path:
    return heuristics_dir() / f"{name}.yaml"


@lru_cache(maxsize=None)
def load_heuristics(name: str) -> dict[str, Any]:
    """The mapping of ``heuristics/<name>.yaml`` (CatalogError if missing or malformed)."""
    return load_yaml(heuristics_path(name))


def sourced_entry(data: dict[str, Any], key: str, where: str) -> Sourced:
    """``key: {value, source}`` from ``data``; value may be a finite number or a string."""
    value, source = sourced_field(data, key, where)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise CatalogError(f"{where}: field {key!r} value {value!r} is not a number or name")
    if not isinstance(value, str) and not finite_number(value):
        raise CatalogError(f"{where}: field {key!r} value {value!r} is not a finite number")
    return Sourced(value=value, source=source)


def sourced_number(data: dict[str, Any], key: str, where: str) -> Sourced:
    """Like :func:`sourced_entry` but the value must be a finite number."""
    entry = sourced_entry(data, key, where)
    if isinstance(entry.value, str):
        raise CatalogError(f"{where}: field {key!r} value {entry.value!r} is not a number")
    return entry


def heuristic(name: str, key: str) -> Sourced:
    """One top-level sourced value of ``heuristics/<name>.yaml``."""
    return sourced_entry(load_heuristics(name), key, str(heuristics_path(name)))


def sourced_table(name: str, key: str, columns: tuple[str, ...]) -> tuple[tuple[dict, ...], str]:
    """Rows of a table ``key: {source, rows: [{col: number...}...]}`` and its source."""
    where = str(heuristics_path(name))
    table = load_heuristics(name).get(key)
    if not isinstance(table, dict) or not isinstance(table.get("rows"), list) or not table["rows"]:
        raise CatalogError(f"{where}: table {key!r} must be a mapping with 'source' and 'rows'")
    source = str(table.get("source", "")).strip()
    if not source:
        raise CatalogError(f"{where}: table {key!r} has no source")
    rows = []
    for index, row in enumerate(table["rows"]):
        if not isinstance(row, dict):
            raise CatalogError(f"{where}: row {index} of table {key!r} is not a mapping")
        for column in columns:
            value = row.get(column)
            if not finite_number(value) or value <= 0:
                raise CatalogError(f"{where}: row {index} of table {key!r} needs a positive "
                                   f"number {column!r}, got {value!r}")
        rows.append({column: float(row[column]) for column in columns})
    return tuple(rows), source
