"""What the local and SLURM executors share: reading submitit jobs.

submitit facts relied on (submitit 1.5.4, submitit/core/submission.py,
submitit/core/core.py): a multi-task job runs the function in every task;
each task pickles ``("success", value)`` or ``("error", traceback)`` to its
own ``job.task(k).paths.result_pickle``. A job killed from outside leaves no
pickle, only its state. ``Job.result()`` of a LocalJob waits for every task,
so task pickles are read directly with ``submitit.core.utils.pickle_load``.
"""

from autoconfig.profiling.executors.base import Executor


class SubmititExecutor(Executor):
    """An executor whose jobs are submitit Jobs."""

    def outcome(self, job):
        """Rank 0's outcome, else the first other rank that reported a failure."""
        first = _task_outcome(job, 0)
        if first is not None:
            return first
        for task in range(1, job.num_tasks):
            outcome = _task_outcome(job, task)
            if outcome is None:
                continue
            kind, value = outcome
            if kind != "success" or (value is not None and (not isinstance(value, dict)
                                                           or value.get("status", "ok") != "ok")):
                return outcome
        return None

    def finished(self, job) -> bool:
        return job.done()

    def state(self, job) -> str:
        try:
            return str(job.state or "UNKNOWN").upper()
        except Exception:  # noqa: BLE001
            return "UNKNOWN"

    def log_tail(self, job) -> str:
        try:
            text = job.task(0).stderr() or ""
        except Exception:  # noqa: BLE001
            return ""
        return "\n".join(text.strip().splitlines()[-3:])

    def cancel(self, job) -> None:
        try:
            job.cancel(check=False)
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass


def _task_outcome(job, task: int):
    """(outcome, value) from a task's result pickle, or None if not written yet."""
    from submitit.core.utils import pickle_load

    path = job.task(task).paths.result_pickle
    if not path.exists():
        return None
    try:
        return tuple(pickle_load(path))
    except Exception as exc:  # noqa: BLE001 - half-written or unreadable
        return ("error", f"unreadable result of task {task}: {type(exc).__name__}: {exc}")
