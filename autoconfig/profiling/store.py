"""The results directory of one profiling sweep.

Layout (all pandas-readable):
- ``plans.csv``: the candidate plans with their predictions, written first;
- ``results.jsonl``: one JSON record per profiled plan, appended as it arrives;
- ``meta.json``: model, workload, cluster and device of the sweep;
- ``.lock``: while a sweep writes here, its pid, host and start time.

Records are keyed by the plan's own fields (``autoconfig.core.plan.Plan``), never by
a directory or file name parsed back. A record is one ``write`` of one line,
flushed and fsync'ed, so a crash leaves at most a torn last line; the next
append starts a new line after it, so a torn line never swallows a record.
Lines that are not a valid record (torn, garbage, not a JSON object, an
unknown status, a non-positive or non-finite time, plan fields of the wrong
type) are never ranked: ``check_store`` copies them to
``results.jsonl.corrupt`` (nothing is deleted) and says how many there are.
The latest valid record of a plan wins.
"""

import json
import math
import os
import socket
import time
from contextlib import contextmanager, suppress
from dataclasses import fields
from pathlib import Path

import pandas as pd

from autoconfig.atomic import write_atomic
from autoconfig.errors import BusyError, InputError
from autoconfig.core.plan import PLAN_FIELDS, Plan

PLANS_FILE = "plans.csv"
RESULTS_FILE = "results.jsonl"
CORRUPT_FILE = "results.jsonl.corrupt"
META_FILE = "meta.json"
LOCK_FILE = ".lock"
PROFILE_SUBDIR = "profile"
"""Where a search's --profile run keeps its results, inside the output folder."""

FINAL_STATUSES = ("ok", "oom", "error", "timeout")
KNOWN_STATUSES = FINAL_STATUSES + ("cancelled", "node_fail")
"""Every status a worker or executor records (``autoconfig.profiling.spec.STATUSES``)."""
POSITIVE_FIELDS = ("step_time_s", "tokens_per_s_per_gpu", "model_tflops_per_gpu",
                   "peak_memory_bytes", "peak_allocated_bytes")
"""Measured figures that, when present, must be positive finite numbers."""
"""Outcomes that belong to the plan itself. ``cancelled`` and ``node_fail``
come from outside the plan, so a resumed sweep runs those plans again."""

RESULT_FIELDS = ("status", "device", "world_size", "step_time_s", "iteration_times_s",
                 "tokens_per_s_per_gpu", "model_tflops_per_gpu", "peak_memory_bytes",
                 "losses", "error", "model_name", "moe_dispatcher", "run_notes",
                 "peak_allocated_bytes")


def is_results_folder(path: Path) -> bool:
    """A profiling results folder: records, or a --profile run's plan table and
    metadata (a search's own plans.csv alone is not one)."""
    path = Path(path)
    return (path / RESULTS_FILE).is_file() or (
        (path / PLANS_FILE).is_file() and (path / META_FILE).is_file())


def results_folder(path: Path) -> Path:
    """``path``, or its ``profile/`` when ``path`` is the output folder of a search
    that profiled (so users may name either)."""
    path = Path(path)
    if not is_results_folder(path) and is_results_folder(path / PROFILE_SUBDIR):
        return path / PROFILE_SUBDIR
    return path


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
    """Append one record to the store's results file (``append_json_line``)."""
    append_json_line(out_dir / RESULTS_FILE, record)


def append_json_line(path: Path, data: dict) -> None:
    """Append ``data`` as one JSON line: a single write, flushed and fsync'ed. After
    a torn last line (a crash mid-write) it starts a line of its own."""
    line = json.dumps(data, sort_keys=False, default=_json_default) + "\n"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            line = "\n" + line
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def record_problem(record) -> str:
    """Why a parsed line is not a usable record ('' when it is)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    status = record.get("status")
    if status not in KNOWN_STATUSES:
        return f"unknown status {str(status)[:40]!r}"
    for name in POSITIVE_FIELDS:
        value = record.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value <= 0:
            return f"{name} {str(value)[:40]} is not a positive number"
    try:
        plan_from_record(record)
    except Exception as exc:  # noqa: BLE001 - any malformed plan field makes the line unusable
        return f"plan fields: {str(exc)[:80]}"
    return ""


def read_store(out_dir: Path) -> tuple[list[dict], list[tuple[int, str, str]]]:
    """(valid records in arrival order, [(line number, line, why)] of the rest).
    Undecodable bytes are replaced, so a damaged file still reads."""
    path = Path(out_dir) / RESULTS_FILE
    if not path.exists():
        return [], []
    records, bad = [], []
    text = path.read_bytes().decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            bad.append((number, line, "not JSON (torn or garbage)"))
            continue
        why = record_problem(record)
        if why:
            bad.append((number, line, why))
        else:
            records.append(record)
    return records, bad


def load_records(out_dir: Path) -> list[dict]:
    """Every valid record in arrival order (see ``read_store`` for the rest)."""
    return read_store(out_dir)[0]


def check_store(out_dir: Path) -> str:
    """Copy the store's unusable lines to ``results.jsonl.corrupt`` (rewritten
    whole each time, so it holds exactly the current ones; results.jsonl is left
    as it is) and return a one-line warning, or '' when every line is a record."""
    _, bad = read_store(out_dir)
    if not bad:
        return ""
    aside = Path(out_dir) / CORRUPT_FILE
    try:
        write_atomic(aside, "".join(f"{line}\n" for _, line, _ in bad))
        kept = f"copied to {aside}"
    except OSError as exc:   # a read-only store still reports; results.jsonl keeps them
        kept = f"left in place (cannot write {aside}: {exc.strerror})"
    first = bad[0]
    return (f"warning: {len(bad)} unusable line(s) in {Path(out_dir) / RESULTS_FILE} not "
            f"counted (line {first[0]}: {first[2]}); {kept}")


def check_meta(out_dir: Path) -> str:
    """A one-line warning when meta.json cannot describe the sweep ('' when it can):
    the report goes on without model, device and executor, as with unusable lines."""
    why = read_meta(out_dir)[1]
    return (f"warning: {Path(out_dir) / META_FILE} is {why}: the report shows model, device "
            "and executor as '?'" if why else "")


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
    """The candidate table (empty with plan columns if there is none). A file
    pandas cannot parse is an InputError naming it: its predictions cannot be
    guessed, and a report or resume without them would mislead."""
    path = Path(out_dir) / PLANS_FILE
    if not path.exists():
        return pd.DataFrame(columns=list(PLAN_FIELDS))
    try:
        return pd.read_csv(path)
    except ValueError as exc:   # EmptyDataError, ParserError, UnicodeDecodeError
        raise InputError(f"{path}: corrupt plan table ({_csv_problem(exc)}); run the "
                         "--profile search again into a new folder (-o) to rebuild it") from None


def _csv_problem(exc: ValueError) -> str:
    """Why pandas could not read a CSV file, in a few words."""
    if isinstance(exc, pd.errors.EmptyDataError):
        return "empty"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text at byte {exc.start}"
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"not CSV: {lines[-1][:80]}" if lines else "not CSV"


def read_meta(out_dir: Path) -> tuple[dict, str]:
    """(meta.json, ''), or ({}, why it cannot describe the sweep): missing,
    unreadable, not UTF-8, not JSON or not an object."""
    path = Path(out_dir) / META_FILE
    if not path.exists():
        return {}, "missing"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except OSError as exc:   # a folder or unreadable file named meta.json
        return {}, f"unreadable ({exc.strerror})"
    except UnicodeDecodeError:
        return {}, "not UTF-8 text"
    except json.JSONDecodeError as exc:
        return {}, f"not valid JSON ({exc})"
    return (data, "") if isinstance(data, dict) else ({}, "not a JSON object")


def load_meta(out_dir: Path) -> dict:
    """meta.json, or {} when it is missing or damaged (``read_meta`` says why):
    the report goes on without it."""
    return read_meta(out_dir)[0]


RETRY_CHOICES = ("failed", "oom", "error", "timeout", "cancelled", "node_fail")
"""What ``--retry`` takes: a status, or ``failed`` for every status but ok."""


def retry_statuses(retry, failed=None) -> frozenset[str]:
    """The statuses ``--retry`` values name: each status itself, and ``failed``
    every one in ``failed`` (default: every record status but ok)."""
    failed = set(KNOWN_STATUSES) - {"ok"} if failed is None else set(failed)
    statuses = set()
    for value in retry or ():
        statuses |= failed if value == "failed" else {value}
    return frozenset(statuses)


def finished_plans(out_dir: Path, retry=()) -> set[Plan]:
    """Plans whose latest record has a final status that is not to be retried."""
    again = retry_statuses(retry)
    return {plan_from_record(record) for record in latest_records(out_dir)
            if record.get("status") in FINAL_STATUSES and record.get("status") not in again}


def pending_plans(out_dir: Path, plans: list[Plan], retry=()) -> list[Plan]:
    """The plans (in the given order) without a final record in ``out_dir``, or whose
    final record has a status in ``retry`` (``RETRY_CHOICES``)."""
    done = finished_plans(out_dir, retry)
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
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "process_start": process_start(os.getpid())}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            holder = _read_lock(path)
            if not holder:   # just created by another sweep, not written yet?
                time.sleep(0.5)
                holder = _read_lock(path)
            if _alive(holder) or (not holder and _age_s(path) < 10):
                who = (f"pid {holder.get('pid')} on {holder.get('host')} since "
                       f"{holder.get('started_at')}" if holder else
                       "its lock is being written now")
                raise BusyError(
                    f"results directory {path.parent} is in use by another sweep ({who}); "
                    f"wait for it, use another output directory, or delete {path} if that sweep "
                    "is gone") from None
            _take_over(path, holder)
            continue
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(json.dumps(mine))
                handle.flush()
                os.fsync(handle.fileno())
        except BaseException as exc:
            # A full disk fails the write: an empty lock left behind would refuse
            # the next run as "in use" though nothing holds the folder.
            with suppress(OSError):
                path.unlink()
            if isinstance(exc, OSError) and exc.filename is None:   # name the file meant
                raise OSError(exc.errno, exc.strerror, str(path)) from None
            raise
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
    recorded = holder.get("process_start")
    if recorded is not None and recorded != process_start(pid):
        return False   # the pid now belongs to another process: the sweep is gone
    return not is_zombie(pid)


def process_start(pid: int) -> int | None:
    """When a process started, in clock ticks since boot (Linux /proc/PID/stat
    field 22): with the pid it names one process, not a reused pid. None where
    /proc is not there."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def is_zombie(pid: int) -> bool:
    """A process that exited but was not reaped (Linux /proc): gone for our purpose."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
