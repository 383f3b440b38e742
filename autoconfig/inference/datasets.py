"""Request-length datasets as sourced data (``heuristics/datasets.yaml``).

A serving benchmark is described by the dataset it draws requests from: the
mean and spread of its prompt and output lengths (``infer --dataset NAME``).
"""

from dataclasses import dataclass
from functools import lru_cache

from autoconfig.errors import CatalogError, InputError
from autoconfig.paths import heuristics_dir
from autoconfig.yamlio import load_yaml, sourced_field

FIELDS = ("input_len_tokens", "input_len_std_tokens", "output_len_tokens",
          "output_len_std_tokens")


@dataclass(frozen=True)
class Dataset:
    name: str
    description: str
    input_len_tokens: float
    input_len_std_tokens: float
    output_len_tokens: float
    output_len_std_tokens: float


@lru_cache(maxsize=1)
def _all() -> dict[str, Dataset]:
    path = heuristics_dir() / "datasets.yaml"
    data = load_yaml(path)
    found = {}
    for name, entry in data.items():
        if not isinstance(entry, dict):
            raise CatalogError(f"{path}: dataset {name!r} must be a mapping")
        values = {}
        for key in FIELDS:
            value, _ = sourced_field(entry, key, f"{path} dataset {name!r}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise CatalogError(f"{path}: dataset {name!r} field {key!r} must be a "
                                   "non-negative number")
            values[key] = float(value)
        if values["input_len_tokens"] < 1 or values["output_len_tokens"] < 1:
            raise CatalogError(f"{path}: dataset {name!r} needs mean lengths of at least 1")
        found[str(name)] = Dataset(name=str(name), description=str(entry.get("description", "")),
                                   **values)
    return found


def names() -> tuple[str, ...]:
    return tuple(sorted(_all()))


def get_dataset(name: str) -> Dataset:
    """The dataset ``name``; InputError naming the choices."""
    found = _all()
    if name not in found:
        raise InputError(f"unknown dataset {name!r}: allowed are {', '.join(sorted(found))}")
    return found[name]
