"""The typed errors of autoconfig.

Every error carries a one-line message that names the bad value and what is
allowed; the CLI prints it and exits with status 2, never a traceback.
"""

import re


class AutoconfigError(Exception):
    """Base of every error autoconfig raises on purpose."""


class InputError(AutoconfigError):
    """The user gave a value that is not allowed (bad size, unknown GPU...)."""


class CatalogError(AutoconfigError):
    """A catalog or heuristics YAML file is missing, malformed or unsourced."""


class InfeasibleError(AutoconfigError):
    """Valid input, but no plan fits: the message says what would."""


class LaunchError(AutoconfigError):
    """A profiling job could not be submitted (no SLURM, bad partition...)."""


class ProfilingError(AutoconfigError):
    """Profiling ran but proved nothing (no plan succeeded): the message says why."""


class BusyError(AutoconfigError):
    """A results directory is held by another live sweep."""


MAX_COUNT = 1 << 20
"""Largest value of a count the user gives (layers, widths, heads, experts,
ranks, parallel sizes, GPUs, batch sizes): 1,048,576, beyond any real model or
cluster, and small enough that numpy's 64-bit arithmetic over plans never
overflows. Larger values are refused with this bound in the message."""

MAX_SEQ_LEN = 1 << 24
"""Largest sequence length (16,777,216 tokens)."""

SHOWN_CHARS = 24


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A value as an error message echoes it: strings quoted, at most ``limit``
    characters (a longer one is cut and ends in '...')."""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


LONG_WORD_CHARS = 120
"""A word of an error message longer than this is a value echoed back (a
100,000-character argument, a mistyped path): it is cut in the middle."""


def shortened(message: str) -> str:
    """An error message with every over-long word cut to its start and end, so
    a bad value never floods the terminal; the rest of the message is kept."""
    def cut(match):
        word = match.group(0)
        return f"{word[:60]}...({len(word)} chars)...{word[-20:]}"
    return re.sub(r"\S{%d,}" % (LONG_WORD_CHARS + 1), cut, message)
