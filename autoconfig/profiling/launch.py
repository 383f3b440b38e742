"""Launch profiling jobs through an executor (``autoconfig.profiling.executors``).

One job per plan. Each job's outcome becomes one record in the results store
as soon as it is known, so an interrupted sweep loses nothing that finished.
This module never asks which executor it has: capacity, preflight,
submission, state, cancel and the state -> status mapping are the executor's.

A job function returns its record: a dict of outcome fields (``status`` first
of all; ``store.result_record`` of a ProfileResult for the training worker,
the inference worker's own fields for inference), or None on ranks other than
0; the first rank that reports decides the record, keyed by the job's plan. SLURM sends USR2
``signal_delay_s`` before the time limit; submitit's handler then raises
"timed-out and not checkpointable" in task 0 (for limits under ~50 min any
USR2 counts as a time-out: SignalHandler.has_timed_out), which we record as
``timeout``. SLURM sends SIGCONT with USR2; see ``_watch_time_limit`` for why
we reset SIGCONT.
"""

import dataclasses
import shutil
import signal
import sys
import time
from contextlib import suppress as _suppress
from pathlib import Path
from typing import Callable, Sequence

from autoconfig.core.plan import PLAN_FIELDS
from autoconfig.errors import LaunchError
from autoconfig.profiling import executors, ownership, store
from autoconfig.profiling.executors.base import Executor, JobItem, LaunchOptions, Run

__all__ = ["JobItem", "LaunchOptions", "launch", "profile_job"]


def launch(items: Sequence[JobItem], options: LaunchOptions, out_dir: Path,
           extra_record: dict | None = None, progress: bool = True,
           on_submitted: Callable[[], None] | None = None) -> list[dict]:
    """Run every item, appending one record per plan to ``out_dir`` as it ends.

    Checks the executor's capacity and preflight first (once). ``on_submitted``
    runs once the jobs are accepted (before any record): the caller writes the
    plan table there, so a refused submission leaves the results directory
    untouched. Returns the records written. One job's failure never stops the
    others.
    """
    items = list(items)
    executor = executors.create(options)
    executor.check_capacity([i.plan for i in items])
    if not items:
        # nothing to run: jobs an earlier sweep left behind are cancelled all the same
        _settle_leftovers(executor, [], Path(out_dir), Path(out_dir) / "jobs")
        if on_submitted is not None:
            on_submitted()
        return []
    executor.preflight()
    out_dir = Path(out_dir)
    folder = out_dir / "jobs"
    created = not folder.exists()
    running = [Run(item) for item in items]
    _settle_leftovers(executor, running, out_dir, folder)
    try:
        executor.submit([run for run in running if run.job is None], folder)
    except LaunchError:
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        _own(executor, running, out_dir)
        if on_submitted is not None:
            on_submitted()
    except BaseException:
        _abandon(executor, running, out_dir, extra_record or {}, [], "sweep stopped")
        raise
    return _collect(executor, running, out_dir, extra_record or {}, progress)


# ---------------------------------------------------------------- ownership


def _own(executor: Executor, running: list[Run], out_dir: Path) -> None:
    """Write down every started job of this sweep (``ownership``)."""
    ownership.save(out_dir, [ownership.entry(run.item.plan, executor.name, executor.handle(run))
                             for run in running if run.job is not None])


def _settle_leftovers(executor: Executor, running: list[Run], out_dir: Path,
                      folder: Path) -> None:
    """Jobs an earlier sweep into this folder started and never recorded (it was
    killed): adopt each whose plan is to run now (its result is collected, the
    plan is not submitted again) and cancel the rest, before anything is
    submitted. Runs under the results folder's lock."""
    leftovers = ownership.load(out_dir)
    if not leftovers:
        return
    wanted = {run.item.plan: run for run in running}
    adopted, cancelled = [], []
    for handle in leftovers:
        if handle.get("executor") != executor.name:
            continue
        try:
            job = executor.reattach(handle, folder)
            plan = store.plan_from_record(handle["plan"])
        except Exception:  # noqa: BLE001 - a handle we cannot read back finds no job
            continue
        if job is None or (executor.finished(job) and executor.outcome(job) is None):
            continue   # gone without a result (killed with its sweep): the plan runs anew
        run = wanted.get(plan)
        if run is not None and run.job is None:
            run.job, run.gpus = job, tuple(handle.get("gpus") or ())
            executor.claim(run)
            adopted.append(str(handle["job_id"]))
        elif not executor.finished(job):
            executor.cancel(job)
            cancelled.append(str(handle["job_id"]))
    _own(executor, running, out_dir)
    if adopted or cancelled:
        print(f"[profile] jobs left by an earlier sweep: adopted {len(adopted)}"
              f"{' (' + ', '.join(adopted) + ')' if adopted else ''}, cancelled {len(cancelled)}"
              f"{' (' + ', '.join(cancelled) + ')' if cancelled else ''}", file=sys.stderr)


def _abandon(executor: Executor, running: list[Run], out_dir: Path, extra: dict,
             records: list[dict], why: str) -> None:
    """The sweep stops early (Ctrl-C, SIGTERM, SIGHUP, a full disk...): cancel every
    started job and record it as cancelled, so a resume runs it again. Best effort
    on the records (the disk may be full); the jobs are cancelled regardless."""
    for run in running:
        if run.job is not None:
            executor.cancel(run.job)
    for run in running:
        if run.job is None:
            continue
        record = _failure_record(executor, run, "cancelled", why)
        record.update(extra)
        with _suppress(OSError):
            store.append_record(out_dir, record)
            records.append(record)
    with _suppress(OSError):
        ownership.save(out_dir, [])


# ---------------------------------------------------------------- collection


def _collect(executor: Executor, running: list[Run], out_dir, extra, show_progress) -> list[dict]:
    records = []
    failed = 0
    folder = out_dir / "jobs"
    last_line = ""
    try:
        while True:
            started = sum(run.job is not None for run in running)
            executor.start(running, folder)
            if sum(run.job is not None for run in running) != started:
                _own(executor, running, out_dir)
            executor.refresh(running)
            for run in [run for run in running if run.job is not None]:
                if not _job_done(executor, run):
                    continue
                try:
                    record = _outcome_record(executor, run)
                except Exception as exc:  # noqa: BLE001 - one odd job never ends the sweep
                    record = _failure_record(executor, run, "error",
                                             f"could not read the outcome: {exc!r}")
                record.update(extra)
                store.append_record(out_dir, record)
                records.append(record)
                failed += record["status"] != "ok"
                executor.release(run)
                running.remove(run)
                _own(executor, running, out_dir)
            queued = sum(1 for run in running if run.job is None)
            line = (f"[profile] {len(records)} done ({failed} failed), "
                    f"{len(running) - queued} running, {queued} queued")
            if show_progress and line != last_line:
                # one updating line on a terminal, one line per change in a log
                tty = sys.stderr.isatty()
                print(("\r" if tty else "") + line, end="" if tty else "\n", file=sys.stderr,
                      flush=True)
                last_line = line
            if not running:
                break
            time.sleep(executor.options.poll_s)
    except BaseException as exc:
        # Interrupted (Ctrl-C, SIGTERM, SIGHUP) or failed (a full disk...): stop what
        # runs; plans without a final record run again on resume.
        why = (f"sweep {getattr(exc, 'reason', 'interrupted')}" if isinstance(exc, KeyboardInterrupt)
               else f"sweep stopped: {type(exc).__name__}: {str(exc)[:200]}")
        _abandon(executor, running, out_dir, extra, records, why)
        if show_progress and sys.stderr.isatty():
            print("", file=sys.stderr)
        raise
    if show_progress and sys.stderr.isatty():
        print("", file=sys.stderr)
    return records


def _outcome_record(executor: Executor, run: Run) -> dict:
    """Map a finished job to a store record."""
    reported = executor.outcome(run.job)
    if reported is None:
        state = executor.state(run.job)
        tail = executor.log_tail(run.job)
        status = executor.status_of(state, tail)
        return _failure_record(executor, run, status,
                               (f"{tail}\n" if tail else "")
                               + _explained(executor, run, status, state, "without a result"))
    outcome, value = reported
    if outcome != "success":
        text = _tail(str(value))
        state = executor.state(run.job) if executor.finished(run.job) else ""
        status = ("timeout" if ("timed-out" in text or "TIMEOUT" in text)
                  else executor.status_of(state) if state else "error")
        if status == "error":   # the traceback's last line says why
            return _failure_record(executor, run, status, text)
        return _failure_record(executor, run, status,
                               f"{text}\n" + _explained(executor, run, status, state, "early"))
    if value is None:
        return _failure_record(executor, run, "error", "no rank returned a result")
    if not isinstance(value, dict):
        return _failure_record(executor, run, "error", f"the job returned a "
                               f"{type(value).__name__}, not a record (a dict of outcome fields)")
    record = {name: getattr(run.item.plan, name) for name in PLAN_FIELDS}
    record.update({k: v for k, v in value.items() if k not in PLAN_FIELDS})
    record.setdefault("status", "ok")
    record.update(_job_fields(executor, run))
    return record


def _explained(executor: Executor, run: Run, status: str, state: str, how: str) -> str:
    """The line that says why a job failed, last in its record's error (the
    report shows the last line): the scheduler's state and, for a time-out,
    the limit that hit and the flags that change it."""
    job = f"job {executor.job_id(run.job)} ended {state or status.upper()} {how}"
    if status == "timeout":
        return (f"TIMEOUT: {job}: the {executor.options.time_limit_min}-minute limit hit "
                "(raise --max-minutes/--time-limit, then --retry timeout)")
    return f"{(state.split() or [status.upper()])[0]}: {job}"


def _failure_record(executor: Executor, run: Run, status: str, error: str) -> dict:
    record = {name: getattr(run.item.plan, name) for name in PLAN_FIELDS}
    record.update(status=status, device=executor.options.device, world_size=run.item.world_size,
                  step_time_s=None, tokens_per_s_per_gpu=None, model_tflops_per_gpu=None,
                  peak_memory_bytes=None, iteration_times_s=[], losses=[], error=error)
    record.update(_job_fields(executor, run))
    return record


def _job_fields(executor: Executor, run: Run) -> dict:
    return {"executor": executor.name,
            "job_id": executor.job_id(run.job) if run.job is not None else None,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


RANKS_GRACE_OK_S = 60.0
"""How long the other ranks may take to exit once rank 0 has reported success."""
RANKS_GRACE_FAILED_S = 5.0
"""...and after a failure, when they may hang in a collective."""


def _job_done(executor: Executor, run: Run) -> bool:
    """Done when the whole job has ended, or a rank has reported (rank 0's
    result, or another rank's failure) and the other ranks had a grace period
    to exit; then they are cancelled."""
    job = run.job
    reported = executor.outcome(job)
    if reported is None:
        return executor.finished(job)
    if run.reported_at is None:
        run.reported_at = time.monotonic()
    if executor.finished(job):
        return True
    kind, value = reported
    ok = kind == "success" and isinstance(value, dict) and value.get("status", "ok") == "ok"
    if time.monotonic() - run.reported_at < (RANKS_GRACE_OK_S if ok else RANKS_GRACE_FAILED_S):
        return False
    executor.cancel(job)
    return True


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ---------------------------------------------------------------- job functions


def profile_job(spec_json: str):
    """The job: one rank of the profiling worker (every task runs this).

    Picks a rendezvous per job (first node of the allocation, a port derived
    from the job id so side-by-side jobs on one node do not collide) and turns
    SLURM's time-limit warning into a ``timeout`` result.
    """
    from autoconfig.profiling.spec import ProfileSpec
    from autoconfig.profiling.worker import run_task

    spec = ProfileSpec.from_json(spec_json)
    spec = dataclasses.replace(spec, **_rendezvous(spec))
    warned = _watch_time_limit()
    result = run_task(spec)
    if result is None:
        return None
    if warned["hit"] and result.status != "ok":
        result = dataclasses.replace(result, status="timeout")
    return store.result_record(result)


RENDEZVOUS_PORTS = (20000, 32768)
"""Ports a job's rank 0 listens on, one per job id: below Linux's default
ephemeral range (net.ipv4.ip_local_port_range 32768-60999), where the outgoing
sockets of jobs running beside it (gloo's peer connections, TCPStore clients)
take their ports; a port from that range was seen taken (EADDRINUSE) by a
neighbour in a local profiling run."""


def rendezvous_port(job_id) -> int:
    """The rendezvous port of the job ``job_id`` (its digits, in ``RENDEZVOUS_PORTS``)."""
    low, high = RENDEZVOUS_PORTS
    digits = "".join(ch for ch in str(job_id) if ch.isdigit()) or "0"
    return low + int(digits) % (high - low)


def _rendezvous(spec) -> dict:
    try:
        import submitit

        env = submitit.JobEnvironment()
        job_id = env.job_id
        host = env.hostnames[0] if env.num_nodes > 1 else spec.master_addr
    except RuntimeError:  # not under submitit
        return {}
    return {"master_addr": host, "master_port": rendezvous_port(job_id)}


def _watch_time_limit() -> dict:
    """Chain onto submitit's USR2 handler, remembering that the limit was hit.

    SLURM sends SIGCONT together with the USR2 warning; submitit's SIGCONT
    handler logs, and when USR2's handler raises inside that logging call the
    logging module swallows the exception (seen here: the job then ran into
    the hard limit). SIGCONT's default action is harmless, so restore it.
    """
    flag = {"hit": False}
    with _suppress(ValueError, AttributeError):
        signal.signal(signal.SIGCONT, signal.SIG_DFL)
    try:
        previous = signal.getsignal(signal.SIGUSR2)
    except (ValueError, AttributeError):
        return flag

    def handler(signum, frame):
        flag["hit"] = True
        if callable(previous):
            previous(signum, frame)

    try:
        signal.signal(signal.SIGUSR2, handler)
    except ValueError:  # not the main thread
        pass
    return flag

