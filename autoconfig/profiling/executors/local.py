"""The local executor: each job's ranks as processes on this machine
(submitit's LocalExecutor), started while under --max-parallel.

submitit facts relied on (submitit 1.5.4, submitit/local/local.py):
``LocalExecutor`` accepts ``tasks_per_node``, ``timeout_min``,
``signal_delay_s`` and ``visible_gpus`` (-> CUDA_VISIBLE_DEVICES); its
controller waits for every task and is ``INTERRUPTED`` when signalled.
"""

import os
import signal
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from autoconfig.errors import InputError
from autoconfig.profiling.executors import register
from autoconfig.profiling.executors._submitit import SubmititExecutor
from autoconfig.profiling.executors.base import Run
from autoconfig.profiling.store import is_zombie, process_start


@dataclass(frozen=True)
class LocalOptions:
    """Settings of the local executor."""

    FLAGS: ClassVar[tuple[str, ...]] = ()

    gpus: tuple[int, ...] | None = None
    """GPU indices jobs may use on cuda (default 0 .. ranks per node - 1)."""

    @classmethod
    def from_flags(cls, **flags) -> "LocalOptions":
        return cls()


@register
class LocalExecutor(SubmititExecutor):
    name = "local"
    Options = LocalOptions
    STATES = {"INTERRUPTED": "cancelled", "CANCELLED": "cancelled", "TIMEOUT": "timeout",
              "OUT_OF_MEMORY": "oom"}
    """The controller is INTERRUPTED when signalled."""

    def __init__(self, options) -> None:
        super().__init__(options)
        # Side-by-side cuda jobs get disjoint GPUs (CUDA_VISIBLE_DEVICES through submitit).
        gpus = self.backend.gpus if self.backend.gpus is not None else range(options.gpus_per_node)
        self.free_gpus = list(gpus) if options.device == "cuda" else []

    def capacity(self) -> int:
        return self.options.gpus_per_node

    def capacity_where(self) -> str:
        return f"the local machine's {self.options.gpus_per_node} ranks (--gpus-per-node)"

    def capacity_more(self) -> str:
        return "--executor slurm"

    @classmethod
    def check_environment(cls, options) -> None:
        if options.device == "cuda" and not local_gpu_visible():
            raise InputError("invalid --device cuda: no NVIDIA GPU is visible on this machine for "
                             "the local executor; use --device cpu, or --executor slurm")

    def submit(self, runs: list[Run], folder: Path) -> None:
        """Nothing to submit: local jobs start in ``start`` as slots free up."""

    def start(self, runs: list[Run], folder: Path) -> None:
        active = sum(1 for run in runs if run.job is not None)
        for run in runs:
            if run.job is not None or active >= self.options.max_parallel:
                continue
            if self.options.device == "cuda":
                if len(self.free_gpus) < run.item.world_size:
                    continue
                run.gpus = tuple(self.free_gpus[:run.item.world_size])
                del self.free_gpus[:run.item.world_size]
            run.job = self._submit_one(run, folder)
            active += 1

    def release(self, run: Run) -> None:
        self.free_gpus += run.gpus

    def handle(self, run: Run) -> dict:
        # the job id is the controller's pid; its start time tells it from a reused pid
        return {**super().handle(run), "pid_start": process_start(int(run.job.job_id))}

    def reattach(self, handle: dict, folder: Path):
        from submitit.local.local import LocalJob

        pid = int(handle["job_id"])
        return LocalJob(folder=folder, job_id=str(pid), tasks=list(range(int(handle["tasks"]))),
                        process=_Controller(pid, handle.get("pid_start")))

    def claim(self, run: Run) -> None:
        self.free_gpus = [gpu for gpu in self.free_gpus if gpu not in run.gpus]

    def _submit_one(self, run: Run, folder: Path):
        import submitit

        options = self.options
        executor = submitit.LocalExecutor(folder=folder)
        delay = options.signal_delay_s if options.signal_delay_s is not None else min(
            30, max(5, options.time_limit_min * 60 // 4))
        executor.update_parameters(timeout_min=options.time_limit_min,
                                   tasks_per_node=run.item.world_size, nodes=1,
                                   signal_delay_s=delay, gpus_per_node=len(run.gpus),
                                   visible_gpus=run.gpus)
        return executor.submit(run.item.fn, *run.item.args)

    def cancel(self, job) -> None:
        """Kill the job's task processes, so the submitit controller exits on
        its own (cancelling it with SIGINT makes it print a KeyboardInterrupt
        traceback on our stderr)."""
        process = getattr(job, "_process", None)
        if process is not None and process.poll() is None:
            children = _child_pids(process.pid)
            for pid in children:
                with suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if children:
                return
        super().cancel(job)

    def dry_run(self, items, folder: Path, echo, label) -> None:
        for item in items:
            echo(f"# local: plan {item.plan.to_dict()}: {item.world_size} process(es) through "
                 f"submitit's LocalExecutor (tasks_per_node={item.world_size}, "
                 f"timeout {self.options.time_limit_min} min) running "
                 f"{item.fn.__module__}.{item.fn.__qualname__}")
        echo(f"# dry run: {len(items)} local job(s); nothing started")


class _Controller:
    """The submitit controller of a job an earlier (now dead) sweep started: the
    little of ``subprocess.Popen`` that LocalJob and ``cancel`` use. It runs
    while a process with its pid and start time lives."""

    def __init__(self, pid: int, started: int | None) -> None:
        self.pid, self.started = pid, started

    def poll(self) -> int | None:
        started = process_start(self.pid)
        alive = started is not None and started == self.started and not is_zombie(self.pid)
        return None if alive else 0

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with suppress(OSError):
                os.kill(self.pid, signum)


def local_gpu_visible() -> bool:
    """An NVIDIA driver device node exists and CUDA_VISIBLE_DEVICES does not hide
    every GPU. Checked without importing torch, so the CLI stays light."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl") or any(Path("/dev").glob("nvidia[0-9]*"))


def _child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; empty elsewhere)."""
    children = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with suppress(OSError, ValueError, IndexError):
            # field 4 is the parent pid; the name (field 2) may hold spaces, so split after ')'
            if int(entry.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.parent.name))
    return children
