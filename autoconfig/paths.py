"""Where the data folders (configs/, heuristics/, benchmarks/) live.

In a source checkout or editable install they sit beside the package; a wheel
carries them inside it under ``autoconfig/_data``. ``AUTOCONFIG_HOME`` points
elsewhere for users who keep their own catalogs.
"""

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def data_root() -> Path:
    """The folder holding configs/ and heuristics/."""
    override = os.environ.get("AUTOCONFIG_HOME")
    if override:
        return Path(override)
    checkout = _PACKAGE_DIR.parent
    if (checkout / "configs").is_dir():
        return checkout
    return _PACKAGE_DIR / "_data"


def configs_dir() -> Path:
    return data_root() / "configs"


def heuristics_dir() -> Path:
    return data_root() / "heuristics"


def benchmarks_dir() -> Path:
    return data_root() / "benchmarks"
