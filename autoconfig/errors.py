"""The typed errors of autoconfig.

Every error carries a one-line message that names the bad value and what is
allowed; the CLI prints it and exits with status 2, never a traceback.
"""


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
