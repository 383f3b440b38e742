"""The SLURM executor: one sbatch job per plan through submitit's
SlurmExecutor; plans that need the same resources go into one job array; a job
has nodes = ceil(GPUs / GPUs per node) and one task per GPU.

submitit facts relied on (submitit 1.5.4 source, submitit/slurm/slurm.py;
../shared/notes/slurm-on-localhost.md):
- ``SlurmExecutor.update_parameters`` takes sbatch names (``time`` in minutes,
  ``ntasks_per_node``, ``gpus_per_node``, ``additional_parameters``,
  ``array_parallelism``, ``signal_delay_s``); submissions made inside
  ``executor.batch()`` become one ``sbatch --array`` job.
- ``submitit.slurm.slurm._make_sbatch_string(command, folder, map_count, **params)``
  renders the sbatch script the executor would write: used by the dry run.
- ``SlurmExecutor(...)`` raises RuntimeError when ``srun`` is not on the PATH;
  a failing ``sbatch`` raises ``FailedJobError`` carrying sbatch's message.
- A job killed from outside (scancel, hard TIMEOUT, NODE_FAIL, OOM kill)
  leaves no pickle, only its sacct state, which ``job.done(force_check=True)``
  refreshes for every job in one sacct call (SlurmInfoWatcher).
- SLURM sends USR2 ``signal_delay_s`` before the time limit (see
  ``launch.profile_job``), checked about every 30 s, so it may come that much
  early; a delay >= the limit signals at the first check, possibly before
  Python has installed the handler. So the job's limit is the budget plus
  SIGNAL_GRACE_MIN and the warning comes SIGNAL_DELAY_S before it.
"""

import math
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Sequence

from autoconfig.errors import InputError, LaunchError
from autoconfig.profiling.executors import register
from autoconfig.profiling.executors._submitit import SubmititExecutor
from autoconfig.profiling.executors.base import JobItem, Run


PING_EVERY_S = 30.0
"""How often a waiting sweep checks that slurmctld answers."""
SIGNAL_GRACE_MIN = 2
"""Minutes SLURM's time limit adds to the profiling budget (``parameters``)."""
SIGNAL_DELAY_S = 60
"""Seconds before SLURM's limit that the job is warned (USR2): the budget's end."""


@dataclass(frozen=True)
class SlurmOptions:
    """sbatch settings of the SLURM executor."""

    FLAGS: ClassVar[tuple[str, ...]] = ("partition", "account", "qos", "slurm_extra")

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    extra: tuple[tuple[str, str], ...] = ()
    """Extra sbatch long options (name without dashes, value)."""
    cpus_per_task: int | None = None

    @classmethod
    def from_flags(cls, partition=None, account=None, qos=None, slurm_extra=()) -> "SlurmOptions":
        return cls(partition=partition, account=account, qos=qos,
                   extra=parse_slurm_extra(slurm_extra or ()))


def parse_slurm_extra(values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` strings (sbatch long options without dashes) to pairs."""
    pairs = []
    for value in values:
        key, sep, val = value.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not key:
            raise InputError(f"invalid --slurm-extra {value!r}: use KEY=VALUE, e.g. constraint=h100")
        pairs.append((key, val))
    return tuple(pairs)


KILLED_BY_WARNING = "User defined signal 2"
"""How srun reports tasks that USR2 killed: the time-limit warning (the only
USR2 a job is sent, ``--signal``) arrived before Python had installed
submitit's handler, when the limit is within ``signal_delay_s`` plus the
start-up of the job. A time-out, not an error."""


@register
class SlurmExecutor(SubmititExecutor):
    name = "slurm"
    Options = SlurmOptions
    STATES = {
        "CANCELLED": "cancelled",
        "NODE_FAIL": "node_fail",
        "TIMEOUT": "timeout",
        "DEADLINE": "timeout",
        "OUT_OF_MEMORY": "oom",
        "PREEMPTED": "cancelled",
    }

    def __init__(self, options) -> None:
        super().__init__(options)
        self._pinged_at = -PING_EVERY_S
        self._down_since: float | None = None

    def capacity(self) -> int:
        return self.options.gpus_per_node * self.options.nodes

    def status_of(self, state: str, log_tail: str = "") -> str:
        """A job whose tasks the time-limit warning killed is a time-out, whatever
        state it ended in (FAILED): srun reports them as ``KILLED_BY_WARNING``."""
        if KILLED_BY_WARNING in log_tail:
            return "timeout"
        return super().status_of(state, log_tail)

    def capacity_where(self) -> str:
        return f"{self.options.nodes} node(s) x {self.options.gpus_per_node} GPUs"

    def capacity_more(self) -> str:
        return "more --nodes"

    def preflight(self) -> None:
        """LaunchError (one line) when SLURM cannot take jobs: no sbatch/srun, or
        ``sbatch --test-only`` rejects the partition/account/qos."""
        for tool in ("sbatch", "srun", "sacct"):
            if shutil.which(tool) is None:
                raise LaunchError(f"SLURM is unreachable: {tool!r} not found on PATH; use --executor "
                                  "local or run on a SLURM login node (scripts/slurm-localhost.sh up "
                                  "for a local one)")
        cmd = ["sbatch", "--test-only", "--time", str(self.options.time_limit_min), "--wrap", "true"]
        for name in ("partition", "account", "qos"):
            if getattr(self.backend, name):
                cmd += [f"--{name}", getattr(self.backend, name)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"SLURM is unreachable: sbatch failed: {exc}") from None
        if proc.returncode != 0:
            raise LaunchError(f"SLURM rejected the job: {first_line(proc.stderr or proc.stdout)}")

    def parameters(self, world_size: int) -> dict:
        """sbatch parameters (submitit SlurmExecutor names) for a job of ``world_size`` ranks."""
        options, backend = self.options, self.backend
        per_node = min(options.gpus_per_node, world_size)
        delay = options.signal_delay_s
        extra_min = 0
        if delay is None:
            # The job gets its whole budget: SLURM's limit is the budget plus a grace,
            # and the warning (USR2) comes a grace before that limit. slurmctld checks
            # for due signals every ~30 s, so a warning may come up to that much early:
            # a grace of 2 minutes and a warning 60 s before the limit lands it at or
            # after the budget, leaving at least 60 s to stop cleanly.
            extra_min, delay = SIGNAL_GRACE_MIN, SIGNAL_DELAY_S
        params = {
            "job_name": options.job_name,
            "time": options.time_limit_min + extra_min,
            "nodes": math.ceil(world_size / per_node),
            "ntasks_per_node": per_node,
            "signal_delay_s": delay,
            "array_parallelism": options.max_parallel,
        }
        if options.device == "cuda":
            params["gpus_per_node"] = per_node
        if backend.cpus_per_task:
            params["cpus_per_task"] = backend.cpus_per_task
        for name in ("partition", "account", "qos"):
            if getattr(backend, name):
                params[name] = getattr(backend, name)
        if backend.extra:
            params["additional_parameters"] = dict(backend.extra)
        return params

    def submit(self, runs: list[Run], folder: Path) -> None:
        """One job array per resource shape."""
        import submitit

        submitted: list[Run] = []
        for world_size, group in group_by_shape([run.item for run in runs]).items():
            group_runs = [run for run in runs if run.item.world_size == world_size]
            try:
                executor = submitit.SlurmExecutor(folder=folder)
                executor.update_parameters(**self.parameters(world_size))
                with executor.batch():
                    jobs = [executor.submit(item.fn, *item.args) for item in group]
            except Exception as exc:  # noqa: BLE001 - sbatch's message, one line
                for run in submitted:
                    self.cancel(run.job)
                raise LaunchError(f"SLURM submission failed: {first_line(str(exc), skip='Command')}"
                                  ) from None
            for run, job in zip(group_runs, jobs):
                run.job = job
            submitted += group_runs

    def reattach(self, handle: dict, folder: Path):
        import submitit

        return submitit.SlurmJob(folder=folder, job_id=str(handle["job_id"]),
                                 tasks=list(range(int(handle["tasks"]))))

    def refresh(self, runs: list[Run]) -> None:
        started = [run for run in runs if run.job is not None]
        if started:
            # one sacct call refreshes the shared watcher for every job
            started[0].job.done(force_check=True)
            self._watch_controller()

    def _watch_controller(self) -> None:
        """Say so while slurmctld does not answer (jobs keep their last known
        state meanwhile), every PING_EVERY_S, and when it answers again."""
        now = time.monotonic()
        if now - self._pinged_at < PING_EVERY_S:
            return
        self._pinged_at = now
        if controller_reachable():
            if self._down_since is not None:
                print(f"[profile] SLURM reachable again after {now - self._down_since:.0f} s",
                      file=sys.stderr, flush=True)
            self._down_since = None
            return
        if self._down_since is None:
            self._down_since = now
        print(f"[profile] SLURM unreachable for {now - self._down_since:.0f} s (scontrol ping), "
              "still waiting", file=sys.stderr, flush=True)

    def scripts(self, items: Sequence[JobItem], folder: Path) -> list[str]:
        """The sbatch scripts a launch would submit (one per resource group)."""
        from submitit.slurm.slurm import _make_sbatch_string

        # the same command line SlurmExecutor._submitit_command_str builds
        command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit",
                            shlex.quote(str(Path(folder).absolute()))])
        scripts = []
        for world_size, group in group_by_shape(items).items():
            map_count = len(group) if len(group) > 1 else None
            scripts.append(_make_sbatch_string(command=command, folder=folder, map_count=map_count,
                                               **self.parameters(world_size)))
        return scripts

    def dry_run(self, items, folder: Path, echo, label) -> None:
        for script, group in zip(self.scripts(items, folder), group_by_shape(items).values()):
            echo(script)
            for index, item in enumerate(group):
                echo(f"# {'array task ' + str(index) if len(group) > 1 else 'job'}: "
                     f"{label(item.plan)} ({item.world_size} ranks)")
            echo("")
        echo(f"# dry run: {len(items)} job(s) in the script(s) above; nothing submitted")


def controller_reachable() -> bool:
    """slurmctld answers ``scontrol ping`` with UP."""
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and "UP" in proc.stdout


def group_by_shape(items: Sequence[JobItem]) -> dict[int, list[JobItem]]:
    """Items by world size: each group is one SLURM job array (same resources)."""
    groups: dict[int, list[JobItem]] = {}
    for item in items:
        groups.setdefault(item.world_size, []).append(item)
    return groups


def first_line(text: str, skip: str = "") -> str:
    for line in str(text).splitlines():
        line = line.strip()
        if line and not (skip and line.startswith(skip)) and not line.startswith("-"):
            return line
    return str(text).strip()[:200]
