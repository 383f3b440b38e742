"""The results directory of one profiling sweep.

Layout (all pandas-readable):
- ``plans.csv``: the candidate plans with their predictions, written first;
- ``results.jsonl``: one JSON record per profiled plan, appended as it arrives;
- ``meta.json``: model, workload, cluster and device of the sweep;
- ``.lock``: while a sweep writes here, its pid, host and start time.

Records are keyed by the plan's own fields (``autoconfig.core.plan.Plan``), never by
a directory or file name parsed back. A record is one ``write`` of one line,
flushed and fsync'ed, so a crash leaves at most a torn last line, which
``load_results`` skips. The latest record of a plan wins.
"""

import json
import os
import socket
import time
from contextlib import contextmanager, suppress
from dataclasses import fields
from pathlib import Path

import pandas as pd

from autoconfig.atomic import write_atomic
from autoconfig.errors import BusyError
from autoconfig.core.plan import PLAN_FIELDS, Plan

PLANS_FILE = "plans.csv"
RESULTS_FILE = "results.jsonl"
META_FILE = "meta.json"
LOCK_FILE = ".lock"
PROFILE_SUBDIR = "profile"
"""Where a search's --profile run keeps its results, inside the output folder."""

FINAL_STATUSES = ("ok", "oom", "error", "timeout")
"""Outcomes that belong to the plan itself. ``cancelled`` and ``node_fail``
come from outside the plan, so a resumed sweep runs those plans again."""

RESULT_FIELDS = ("status", "device", "world_size", "step_time_s", "iteration_times_s",
                 "tokens_per_s_per_gpu", "model_tflops_per_gpu", "peak_memory_bytes",
                 "losses", "error", "model_name", "moe_dispatcher", "run_notes")


def plan_key(plan: Plan) -> tuple:
    """The plan's field values in declaration order: the store's key."""
    return tuple(getattr(plan, name) for name in PLAN_FIELDS)


def plan_from_record(record: dict) -> Plan:
    """Rebuild a Plan from the plan fields of a record (other keys ignored). A field
    the record lacks (written before the field existed) or left empty (a CSV
    cell read back as NaN) takes the field's default."""
    kwargs = {}
    for f in fields(Plan):
        value = record.get(f.name, f.default)
        if value is None or (isinstance(value, float) and value != value):
            value = f.default
        kwargs[f.name] = bool(value) if f.type in (bool, "bool") else (
            int(value) if f.type in (int, "int") else value)
    return Plan(**kwargs)


def result_record(result, **extra) -> dict:
    """A flat JSON-ready record of a ProfileResult: plan fields, then outcome fields.

    Flat so that ``pd.read_json(path, lines=True)`` gives one column per field.
    """
    record = {name: getattr(result.plan, name) for name in PLAN_FIELDS}
    for name in RESULT_FIELDS:
        value = getattr(result, name, None)
        record[name] = list(value) if isinstance(value, tuple) else value
    record.update(extra)
    return record


def write_plans(out_dir: Path, plans_df: pd.DataFrame, meta: dict) -> None:
    """Write the candidate table and sweep metadata (atomically, temp + rename)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / PLANS_FILE, plans_df.to_csv(index=False))
    write_atomic(out_dir / META_FILE, json.dumps(meta, indent=2, sort_keys=True, default=str))


def append_record(out_dir: Path, record: dict) -> None:
    """Append one record as one line: a single write, flushed and fsync'ed."""
    line = json.dumps(record, sort_keys=False, default=_json_default) + "\n"
    path = out_dir / RESULTS_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def load_records(out_dir: Path) -> list[dict]:
    """Every readable record in arrival order (a torn last line is skipped)."""
    path = Path(out_dir) / RESULTS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def latest_records(out_dir: Path) -> list[dict]:
    """The latest record of each plan, in the order plans first appeared."""
    latest: dict[tuple, dict] = {}
    for record in load_records(out_dir):
        latest[plan_key(plan_from_record(record))] = record
    return list(latest.values())


def load_results(out_dir: Path) -> pd.DataFrame:
    """The latest record of each plan as a DataFrame (empty with plan columns if none)."""
    records = latest_records(out_dir)
    if not records:
        return pd.DataFrame(columns=list(PLAN_FIELDS) + list(RESULT_FIELDS))
    return pd.DataFrame(records)


def load_plans(out_dir: Path) -> pd.DataFrame:
    path = Path(out_dir) / PLANS_FILE
    return pd.read_csv(path) if path.exists() else pd.DataFrame(columns=list(PLAN_FIELDS))


def load_meta(out_dir: Path) -> dict:
    path = Path(out_dir) / META_FILE
    return json.loads(path.read_text()) if path.exists() else {}


def finished_plans(out_dir: Path) -> set[Plan]:
    """Plans whose latest record has a final status."""
    return {plan_from_record(record) for record in latest_records(out_dir)
            if record.get("status") in FINAL_STATUSES}


def pending_plans(out_dir: Path, plans: list[Plan]) -> list[Plan]:
    """The plans (in the given order) without a final record in ``out_dir``."""
    done = finished_plans(out_dir)
    return [p for p in plans if p not in done]


def _json_default(value):
    # numpy scalars from PlanTable rows
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serialisable: {value!r}")


# ---------------------------------------------------------------- lock


@contextmanager
def lock(out_dir: Path):
    """Hold ``out_dir`` for one sweep: ``.lock`` created with O_EXCL holds the
    pid, host and start time. A lock of a live sweep raises BusyError (one
    line); a stale one (same host, process gone) is taken over. Folders the
    lock created are removed again if the sweep leaves them empty."""
    out_dir = Path(out_dir)
    created = [p for p in [out_dir, *out_dir.parents] if not p.exists()]
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_FILE
    _acquire(path)
    try:
        yield path
    finally:
        with suppress(OSError):
            if _read_lock(path).get("pid") == os.getpid():
                path.unlink()
        for folder in created:   # deepest first
            with suppress(OSError):
                folder.rmdir()


def _acquire(path: Path) -> None:
    mine = {"pid": os.getpid(), "host": socket.gethostname(),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            holder = _read_lock(path)
            if not holder:   # just created by another sweep, not written yet?
                time.sleep(0.5)
                holder = _read_lock(path)
            if _alive(holder) or (not holder and _age_s(path) < 10):
                raise BusyError(
                    f"results directory {path.parent} is in use by another sweep (pid "
                    f"{holder.get('pid')} on {holder.get('host')} since {holder.get('started_at')}); "
                    f"wait for it, use another output directory, or delete {path} if that sweep "
                    "is gone") from None
            _take_over(path, holder)
            continue
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(mine))
            handle.flush()
            os.fsync(handle.fileno())
        return
    raise BusyError(f"results directory {path.parent}: could not take its lock {path}; "
                    "another sweep keeps taking it")


def _take_over(path: Path, stale: dict) -> None:
    """Remove a stale lock, unless another process replaced it meanwhile."""
    aside = path.with_name(f"{LOCK_FILE}.stale.{os.getpid()}")
    with suppress(FileNotFoundError):
        os.rename(path, aside)    # atomic: only one taker wins the rename
        if _read_lock(aside) != stale:   # someone else's fresh lock: put it back
            with suppress(OSError):
                os.link(aside, path)
        aside.unlink()


def _read_lock(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text() or "{}")
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


def _alive(holder: dict) -> bool:
    """Whether the lock's sweep may still run. A lock from another host is
    taken as alive (its process cannot be checked from here); an unreadable
    one is not (``_acquire`` gives a young one time to be written)."""
    pid = holder.get("pid")
    if not isinstance(pid, int):
        return False
    if holder.get("host") != socket.gethostname():
        return True
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A process that exited but was not reaped (Linux /proc): gone for our purpose."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
