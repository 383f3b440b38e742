"""The executor interface: where profiling jobs run.

An executor takes JobItems (one plan each), checks up front that it can run
them (capacity, preflight), submits them, reports each job's state and
outcome while the sweep polls, cancels, maps its scheduler states to record
statuses and prints a dry run. ``launch.py`` and ``sweep.py`` talk only to
this class; each backend is one module of this package with its own options
dataclass (``Executor.Options``), registered by name in
``autoconfig.profiling.executors``.

Shared settings (device, ranks per node, nodes, time limit, parallelism) are
``LaunchOptions``; backend settings (SLURM partition, account...) are the
backend's own ``Options`` carried in ``LaunchOptions.backend``.
"""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Sequence

from autoconfig.errors import InputError, LaunchError
from autoconfig.core.plan import Plan
from autoconfig.profiling.spec import DEVICES, STATUSES


@dataclass(frozen=True)
class LaunchOptions:
    """How and where jobs run, for every executor (the ``--executor`` family of flags)."""

    executor: str = "local"
    """A registered executor name (``autoconfig.profiling.executors.names()``)."""
    device: str = "cpu"
    gpus_per_node: int = 1
    """Ranks per node: GPUs per node on cuda; on cpu, processes per node."""
    nodes: int = 1
    """Nodes available to one job (an executor may give fewer: local gives 1)."""
    time_limit_min: int = 10
    """Time limit of each job in minutes."""
    max_parallel: int = 4
    """Jobs running at once."""
    job_name: str = "autoconfig-profile"
    signal_delay_s: int | None = None
    """Seconds before the limit that the job is warned; default: the executor's."""
    poll_s: float = 1.0
    backend: Any = None
    """The executor's own options (its ``Options`` dataclass); None: its defaults."""

    def __post_init__(self) -> None:
        from autoconfig.profiling import executors

        executors.get(self.executor)   # InputError naming the registered ones
        if self.device not in DEVICES:
            raise InputError(f"invalid device {self.device!r}: allowed are {', '.join(DEVICES)}")
        for name in ("gpus_per_node", "nodes", "time_limit_min", "max_parallel"):
            if getattr(self, name) < 1:
                raise InputError(f"invalid {name.replace('_', ' ')} {getattr(self, name)}: must be >= 1")


@dataclass(frozen=True)
class JobItem:
    """One plan to run: the function and its arguments (picklable, importable)."""

    plan: Plan
    world_size: int
    fn: Callable
    args: tuple


@dataclass
class Run:
    """A plan's job while the sweep runs (job None: accepted, not started yet)."""

    item: JobItem
    job: object = None
    reported_at: float | None = None
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class NoOptions:
    """An executor without settings of its own."""

    FLAGS: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_flags(cls, **flags) -> "NoOptions":
        return cls()


class Executor(ABC):
    """A place to run profiling jobs. Subclasses set ``name`` and ``Options``
    and implement the abstract methods; the sweep never asks which one it has."""

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    """The backend's options dataclass; ``Options.FLAGS`` names the CLI flags
    (click parameter names) it is built from by ``Options.from_flags(**values)``."""
    STATES: ClassVar[dict[str, str]] = {}
    """Scheduler state (first word, upper case) -> record status; others: error."""
    needs_worker: ClassVar[bool] = True
    """Jobs run the profiling worker here or on the cluster (torch, megatron-core);
    an executor that answers from elsewhere (replay) needs neither."""

    def __init__(self, options: LaunchOptions) -> None:
        self.options = options
        self.backend = options.backend if options.backend is not None else self.Options()
        if not isinstance(self.backend, self.Options):
            raise InputError(f"invalid options for the {self.name} executor: "
                             f"{type(self.backend).__name__}, expected {self.Options.__name__}")

    # ---------------------------------------------------------- up-front checks

    @abstractmethod
    def capacity(self) -> int:
        """Most ranks one job can have."""

    def capacity_where(self) -> str:
        """Where the capacity comes from (for the error)."""
        return f"{self.capacity()} ranks"

    def capacity_more(self) -> str:
        """What gives more ranks (for the error)."""
        return "another executor"

    def check_capacity(self, plans: Sequence[Plan]) -> None:
        """LaunchError when a plan needs more ranks than this executor can give."""
        per_node_limit = self.options.gpus_per_node
        capacity = self.capacity()
        for plan in plans:
            per_node = min(per_node_limit, plan.num_gpus)
            if plan.num_gpus % per_node:
                raise LaunchError(
                    f"plan tp={plan.tp} pp={plan.pp} cp={plan.cp} dp={plan.dp} needs {plan.num_gpus} "
                    f"GPUs, not a whole number of nodes of {per_node_limit}: profile plans "
                    f"that fill whole nodes")
            if plan.num_gpus > capacity:
                raise LaunchError(
                    f"plan tp={plan.tp} pp={plan.pp} cp={plan.cp} dp={plan.dp} needs {plan.num_gpus} "
                    f"GPUs but the {self.name} executor has {capacity} ({self.capacity_where()}): use "
                    f"fewer GPUs or {self.capacity_more()}")

    @classmethod
    def check_environment(cls, options: LaunchOptions) -> None:
        """InputError when this machine cannot run jobs of ``options.device``
        (checked before the search, without importing torch). Default: none."""

    def preflight(self) -> None:
        """LaunchError (one line) when the backend cannot take jobs now."""

    # ---------------------------------------------------------- running

    @abstractmethod
    def submit(self, runs: list[Run], folder: Path) -> None:
        """Accept every run (LaunchError, nothing left running, when refused).
        An executor may start jobs later, in ``start``."""

    def start(self, runs: list[Run], folder: Path) -> None:
        """Start accepted jobs that can run now (called every poll)."""

    def refresh(self, runs: list[Run]) -> None:
        """Update the state of every started job at once (called every poll)."""

    def release(self, run: Run) -> None:
        """A job ended: give back what it held."""

    @abstractmethod
    def outcome(self, job) -> tuple[str, object] | None:
        """("success", value) or ("error", text) once the job reported, else None."""

    @abstractmethod
    def finished(self, job) -> bool:
        """The job ended (with or without reporting)."""

    @abstractmethod
    def state(self, job) -> str:
        """The scheduler's state of the job, upper case ("UNKNOWN" when none)."""

    def status_of(self, state: str, log_tail: str = "") -> str:
        """Record status of a job that ended in ``state`` without a result
        (``log_tail``: the end of its error log, where the executor's launcher
        may say more than the state does)."""
        status = self.STATES.get((state.split() or ["UNKNOWN"])[0], "error")
        return status if status in STATUSES else "error"

    def log_tail(self, job) -> str:
        """The end of the job's error log, or ""."""
        return ""

    def job_id(self, job) -> str | None:
        return getattr(job, "job_id", None)

    # ---------------------------------------------------------- ownership

    def handle(self, run: Run) -> dict:
        """What finds the started job again once this process is gone
        (``autoconfig.profiling.ownership``): its id, task count and GPUs."""
        return {"job_id": self.job_id(run.job), "tasks": run.item.world_size,
                "gpus": list(run.gpus)}

    def reattach(self, handle: dict, folder: Path):
        """The job an earlier sweep left behind, from its handle, to adopt or
        cancel; None when this executor cannot find jobs again."""
        return None

    def claim(self, run: Run) -> None:
        """An adopted job holds what it held before (the local executor: its GPUs)."""

    @abstractmethod
    def cancel(self, job) -> None:
        """Stop a job (best effort, never raises)."""

    # ---------------------------------------------------------- dry run

    def scripts(self, items: Sequence[JobItem], folder: Path) -> list[str]:
        """The scripts a submission would hand to the scheduler (e.g. sbatch
        files), as text; empty for an executor that writes none."""
        return []

    @abstractmethod
    def dry_run(self, items: Sequence[JobItem], folder: Path, echo, label) -> None:
        """Print what would be submitted; submit nothing, write nothing.
        ``label(plan)`` is the plan's one-line description."""

