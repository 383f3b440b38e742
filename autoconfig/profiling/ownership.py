"""The jobs a sweep owns, written down as soon as they exist.

``jobs.json`` in the results directory lists every job the sweep has started
and not yet recorded: its plan, executor, job id, task count, the GPUs it
holds and, for a local job, when its controller process started (a pid alone
may be reused). A sweep killed without a chance to cancel (kill -9, a crash,
a lost node) leaves that list behind; the next sweep into the folder reads it
after taking the lock and, before submitting anything, adopts each job whose
plan it still wants (collecting its result instead of running the plan
again) and cancels the others. An unreadable list is set aside as
``jobs.json.corrupt`` and counts as empty.
"""

import json
import os
from contextlib import suppress
from pathlib import Path

from autoconfig.atomic import write_atomic
from autoconfig.core.plan import Plan

JOBS_FILE = "jobs.json"
CORRUPT_SUFFIX = ".corrupt"


def entry(plan: Plan, executor: str, handle: dict) -> dict:
    """One owned job: the plan's fields and the executor's handle (job id, tasks...)."""
    return {"plan": plan.to_dict(), "executor": executor, **handle}


def save(out_dir: Path, entries: list[dict]) -> None:
    """Replace the list (atomically); an empty list removes the file."""
    path = Path(out_dir) / JOBS_FILE
    if not entries:
        with suppress(FileNotFoundError):
            path.unlink()
        return
    write_atomic(path, json.dumps({"jobs": entries}, indent=1, default=str))


def load(out_dir: Path) -> list[dict]:
    """The jobs an earlier sweep left listed ([] when none or unreadable)."""
    path = Path(out_dir) / JOBS_FILE
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError):
        _set_aside(path)
        return []
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list):
        _set_aside(path)
        return []
    return [job for job in jobs if isinstance(job, dict) and isinstance(job.get("plan"), dict)
            and job.get("job_id") not in (None, "")]


def _set_aside(path: Path) -> None:
    with suppress(OSError):
        os.replace(path, path.with_name(path.name + CORRUPT_SUFFIX))
