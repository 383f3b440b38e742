"""Executors by name: ``get("slurm")`` gives the class, ``names()`` every one.

Each module of this package (not starting with ``_``, not ``base``) defines
one executor and registers it with ``register``; it is found by scanning the
package, so adding a backend is adding one module. Code elsewhere (a test, a
plugin) registers its own with ``register`` too. Executor modules import
their heavy dependencies (submitit) lazily, so listing them stays cheap.
"""

import importlib
import pkgutil

from autoconfig.errors import InputError

_REGISTRY: dict[str, type] = {}
_SCANNED = False


def register(cls: type) -> type:
    """Register an Executor subclass under ``cls.name`` (usable as a decorator)."""
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def _scan() -> None:
    global _SCANNED
    if _SCANNED:
        return
    _SCANNED = True
    for module in pkgutil.iter_modules(__path__):
        if module.name != "base" and not module.name.startswith("_"):
            importlib.import_module(f"{__name__}.{module.name}")


def names() -> tuple[str, ...]:
    """Registered executor names: the package's own first (sorted), then others."""
    _scan()
    return tuple(_REGISTRY)


def get(name: str) -> type:
    """The executor class registered as ``name`` (InputError naming the others)."""
    _scan()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise InputError(f"invalid executor {name!r}: allowed are {', '.join(names())}") from None


def create(options):
    """The executor that ``options.executor`` names, set up with ``options``."""
    return get(options.executor)(options)
