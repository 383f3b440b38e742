"""Launch profiling jobs through submitit, on SLURM or as local processes.

One job per plan. On SLURM, plans that need the same resources go into one job
array; a job has nodes = ceil(GPUs / GPUs per node) and one task per GPU. Each
job's outcome becomes one record in the results store as soon as it is known,
so an interrupted sweep loses nothing that finished.

submitit facts relied on (submitit 1.5.4 source, submitit/slurm/slurm.py,
submitit/core/core.py, submitit/local/local.py; ../shared/notes/slurm-on-localhost.md):
- ``SlurmExecutor.update_parameters`` takes sbatch names (``time`` in minutes,
  ``ntasks_per_node``, ``gpus_per_node``, ``additional_parameters``,
  ``array_parallelism``, ``signal_delay_s``); submissions made inside
  ``executor.batch()`` become one ``sbatch --array`` job.
- ``submitit.slurm.slurm._make_sbatch_string(command, folder, map_count, **params)``
  renders the sbatch script the executor would write: used by ``--dry-run``.
- ``SlurmExecutor(...)`` raises RuntimeError when ``srun`` is not on the PATH;
  a failing ``sbatch`` raises ``FailedJobError`` carrying sbatch's message.
- A multi-task job runs the function in every task; each task pickles
  ``("success", value)`` or ``("error", traceback)`` to its own
  ``job.task(k).paths.result_pickle`` (submitit/core/submission.py). A job
  killed from outside (scancel, hard TIMEOUT, NODE_FAIL, OOM kill) leaves no
  pickle, only its sacct state, which ``job.done(force_check=True)`` refreshes
  for every job in one sacct call (SlurmInfoWatcher).
- ``Job.result()`` of a LocalJob waits for the whole controller (all tasks), so
  we read task pickles directly with ``submitit.core.utils.pickle_load``.
- SLURM sends USR2 ``signal_delay_s`` before the time limit; submitit's handler
  then raises "timed-out and not checkpointable" in task 0 (for limits under
  ~50 min any USR2 counts as a time-out: SignalHandler.has_timed_out), which
  we record as ``timeout``. A delay >= the limit signals at the first 30 s
  check, possibly before Python has installed the handler: USR2's default
  action then kills the task (seen here), so our default delay is a quarter
  of the limit, at most 90 s. SLURM sends SIGCONT with USR2; see
  ``_watch_time_limit`` for why we reset SIGCONT.
- ``LocalExecutor`` accepts ``tasks_per_node``, ``timeout_min``,
  ``signal_delay_s`` and ``visible_gpus`` (-> CUDA_VISIBLE_DEVICES); its
  controller waits for every task and is ``INTERRUPTED`` when signalled.
"""

import dataclasses
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from contextlib import suppress as _suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from autoconfig.errors import InputError, LaunchError
from autoconfig.core.plan import PLAN_FIELDS, Plan
from autoconfig.profiling import store

EXECUTORS = ("local", "slurm")
DEVICES = ("cpu", "cuda")

_SLURM_STATUS = {
    "CANCELLED": "cancelled",
    "NODE_FAIL": "node_fail",
    "TIMEOUT": "timeout",
    "DEADLINE": "timeout",
    "OUT_OF_MEMORY": "oom",
    "PREEMPTED": "cancelled",
    "INTERRUPTED": "cancelled",   # LocalExecutor: the process got a signal
}


@dataclass(frozen=True)
class LaunchOptions:
    """How and where jobs run (the ``--executor`` family of flags)."""

    executor: str = "local"
    device: str = "cpu"
    gpus_per_node: int = 1
    """Ranks per node: GPUs per node on cuda; on cpu, processes per node."""
    nodes: int = 1
    """Nodes available to one job (local: always 1)."""
    time_limit_min: int = 10
    max_parallel: int = 4
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    slurm_extra: tuple[tuple[str, str], ...] = ()
    job_name: str = "autoconfig-profile"
    signal_delay_s: int | None = None
    """Seconds before the limit that SLURM warns the job; default a quarter of it (<= 90)."""
    cpus_per_task: int | None = None
    poll_s: float = 1.0

    def __post_init__(self) -> None:
        if self.executor not in EXECUTORS:
            raise InputError(f"invalid executor {self.executor!r}: allowed are {', '.join(EXECUTORS)}")
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


def check_capacity(plans: Sequence[Plan], options: LaunchOptions) -> None:
    """LaunchError when a plan needs more ranks than the executor can give."""
    capacity = options.gpus_per_node * (options.nodes if options.executor == "slurm" else 1)
    where = (f"{options.nodes} node(s) x {options.gpus_per_node} GPUs" if options.executor == "slurm"
             else f"the local machine's {options.gpus_per_node} ranks (--gpus-per-node)")
    for plan in plans:
        per_node = min(options.gpus_per_node, plan.num_gpus)
        if plan.num_gpus % per_node:
            raise LaunchError(
                f"plan tp={plan.tp} pp={plan.pp} cp={plan.cp} dp={plan.dp} needs {plan.num_gpus} "
                f"GPUs, not a whole number of nodes of {options.gpus_per_node}: profile plans "
                f"that fill whole nodes")
        if plan.num_gpus > capacity:
            raise LaunchError(
                f"plan tp={plan.tp} pp={plan.pp} cp={plan.cp} dp={plan.dp} needs {plan.num_gpus} GPUs "
                f"but the {options.executor} executor has {capacity} ({where}): use fewer GPUs or "
                f"{'more --nodes' if options.executor == 'slurm' else '--executor slurm'}")


def job_shape(world_size: int, options: LaunchOptions) -> tuple[int, int]:
    """(nodes, tasks per node): one task per GPU, whole nodes."""
    per_node = min(options.gpus_per_node, world_size)
    return math.ceil(world_size / per_node), per_node


def slurm_parameters(world_size: int, options: LaunchOptions) -> dict:
    """sbatch parameters (submitit SlurmExecutor names) for a job of ``world_size`` ranks."""
    nodes, per_node = job_shape(world_size, options)
    delay = options.signal_delay_s
    if delay is None:
        delay = min(90, max(10, options.time_limit_min * 60 // 4))
    params = {
        "job_name": options.job_name,
        "time": options.time_limit_min,
        "nodes": nodes,
        "ntasks_per_node": per_node,
        "signal_delay_s": delay,
        "array_parallelism": options.max_parallel,
    }
    if options.device == "cuda":
        params["gpus_per_node"] = per_node
    if options.cpus_per_task:
        params["cpus_per_task"] = options.cpus_per_task
    for name in ("partition", "account", "qos"):
        if getattr(options, name):
            params[name] = getattr(options, name)
    if options.slurm_extra:
        params["additional_parameters"] = dict(options.slurm_extra)
    return params


def render_sbatch(items: Sequence[JobItem], options: LaunchOptions, folder: Path) -> list[str]:
    """The sbatch scripts a SLURM launch would submit (one per resource group)."""
    from submitit.slurm.slurm import _make_sbatch_string

    # the same command line SlurmExecutor._submitit_command_str builds
    command = " ".join([shlex.quote(sys.executable), "-u -m submitit.core._submit",
                        shlex.quote(str(Path(folder).absolute()))])
    scripts = []
    for world_size, group in group_by_shape(items).items():
        params = slurm_parameters(world_size, options)
        map_count = len(group) if len(group) > 1 else None
        scripts.append(_make_sbatch_string(command=command, folder=folder, map_count=map_count, **params))
    return scripts


def preflight_slurm(options: LaunchOptions) -> None:
    """LaunchError (one line) when SLURM cannot take jobs: no sbatch/srun, or
    ``sbatch --test-only`` rejects the partition/account/qos."""
    for tool in ("sbatch", "srun", "sacct"):
        if shutil.which(tool) is None:
            raise LaunchError(f"SLURM is unreachable: {tool!r} not found on PATH; use --executor local "
                              "or run on a SLURM login node (scripts/slurm-localhost.sh up for a local one)")
    cmd = ["sbatch", "--test-only", "--time", str(options.time_limit_min), "--wrap", "true"]
    for name in ("partition", "account", "qos"):
        if getattr(options, name):
            cmd += [f"--{name}", getattr(options, name)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"SLURM is unreachable: sbatch failed: {exc}") from None
    if proc.returncode != 0:
        raise LaunchError(f"SLURM rejected the job: {_first_line(proc.stderr or proc.stdout)}")


def launch(items: Sequence[JobItem], options: LaunchOptions, out_dir: Path,
           extra_record: dict | None = None, progress: bool = True,
           on_submitted: Callable[[], None] | None = None) -> list[dict]:
    """Run every item, appending one record per plan to ``out_dir`` as it ends.

    ``on_submitted`` runs once the jobs are accepted (before any record): the
    caller writes the plan table there, so a refused submission leaves the
    results directory untouched. Returns the records written. One job's
    failure never stops the others.
    """
    items = list(items)
    check_capacity([i.plan for i in items], options)
    if not items:
        if on_submitted is not None:
            on_submitted()
        return []
    if options.executor == "slurm":
        preflight_slurm(options)
    folder = Path(out_dir) / "jobs"
    created = not folder.exists()
    try:
        running = _submit(items, options, folder)
    except LaunchError:
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if on_submitted is not None:
        on_submitted()
    return _collect(running, options, Path(out_dir), extra_record or {}, progress)


# ---------------------------------------------------------------- submission


@dataclass
class _Run:
    """A plan's job while the sweep runs (job None: not started yet, local)."""

    item: JobItem
    job: object = None
    reported_at: float | None = None
    gpus: tuple[int, ...] = ()


def group_by_shape(items: Sequence[JobItem]) -> dict[int, list[JobItem]]:
    """Items by world size: each group is one SLURM job array (same resources)."""
    groups: dict[int, list[JobItem]] = {}
    for item in items:
        groups.setdefault(item.world_size, []).append(item)
    return groups


def _submit(items, options, folder):
    """Submit on SLURM (one array per resource shape); local jobs start later."""
    if options.executor == "local":
        return [_Run(item) for item in items]
    import submitit

    running = []
    for world_size, group in group_by_shape(items).items():
        try:
            executor = submitit.SlurmExecutor(folder=folder)
            executor.update_parameters(**slurm_parameters(world_size, options))
            with executor.batch():
                jobs = [executor.submit(item.fn, *item.args) for item in group]
        except Exception as exc:  # noqa: BLE001 - sbatch's message, one line
            for run in running:
                _cancel(run.job)
            raise LaunchError(f"SLURM submission failed: {_first_line(str(exc), skip='Command')}") from None
        running += [_Run(item, job) for item, job in zip(group, jobs)]
    return running


def _submit_local(item: JobItem, options: LaunchOptions, folder: Path, gpus: tuple[int, ...]):
    import submitit

    executor = submitit.LocalExecutor(folder=folder)
    delay = options.signal_delay_s if options.signal_delay_s is not None else min(
        30, max(5, options.time_limit_min * 60 // 4))
    executor.update_parameters(timeout_min=options.time_limit_min, tasks_per_node=item.world_size,
                               nodes=1, signal_delay_s=delay, gpus_per_node=len(gpus),
                               visible_gpus=gpus)
    return executor.submit(item.fn, *item.args)


def _cancel(job) -> None:
    """scancel a SLURM job; for a local job kill its task processes, so the
    submitit controller exits on its own (cancelling it with SIGINT makes it
    print a KeyboardInterrupt traceback on our stderr)."""
    process = getattr(job, "_process", None)
    if process is not None and process.poll() is None:
        children = _child_pids(process.pid)
        for pid in children:
            with _suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if children:
            return
    try:
        job.cancel(check=False)
    except Exception:  # noqa: BLE001 - best effort on the way out
        pass


def _child_pids(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc; empty elsewhere)."""
    children = []
    for entry in Path("/proc").glob("[0-9]*/stat"):
        with _suppress(OSError, ValueError, IndexError):
            # field 4 is the parent pid; the name (field 2) may hold spaces, so split after ')'
            if int(entry.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                children.append(int(entry.parent.name))
    return children


# ---------------------------------------------------------------- collection


def _collect(running: list[_Run], options, out_dir, extra, show_progress) -> list[dict]:
    records = []
    failed = 0
    folder = out_dir / "jobs"
    last_line = ""
    # Local cuda jobs get disjoint GPUs (CUDA_VISIBLE_DEVICES through submitit).
    free_gpus = list(range(options.gpus_per_node)) if options.device == "cuda" else []
    try:
        while True:
            if options.executor == "local":
                _start_local(running, options, folder, free_gpus)
            unfinished = [run for run in running if run.job is not None]
            if unfinished and options.executor == "slurm":
                # one sacct call refreshes the shared watcher for every job
                unfinished[0].job.done(force_check=True)
            for run in unfinished:
                if not _job_done(run):
                    continue
                try:
                    record = _outcome_record(run.item, run.job, options)
                except Exception as exc:  # noqa: BLE001 - one odd job never ends the sweep
                    record = _failure_record(run.item, options, "error",
                                             f"could not read the outcome: {exc!r}", run.job)
                record.update(extra)
                store.append_record(out_dir, record)
                records.append(record)
                failed += record["status"] != "ok"
                free_gpus += run.gpus
                running.remove(run)
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
            time.sleep(options.poll_s)
    except KeyboardInterrupt:
        # Interrupted sweep: stop what runs; plans without a final record run on --resume.
        for run in running:
            if run.job is not None:
                _cancel(run.job)
                record = _failure_record(run.item, options, "cancelled", "sweep interrupted",
                                         run.job)
                record.update(extra)
                store.append_record(out_dir, record)
                records.append(record)
        if show_progress and sys.stderr.isatty():
            print("", file=sys.stderr)
        raise
    if show_progress and sys.stderr.isatty():
        print("", file=sys.stderr)
    return records


def _start_local(running: list[_Run], options, folder: Path, free_gpus: list[int]) -> None:
    """Start queued local jobs while under --max-parallel (and GPUs are free)."""
    active = sum(1 for run in running if run.job is not None)
    for run in running:
        if run.job is not None or active >= options.max_parallel:
            continue
        if options.device == "cuda":
            if len(free_gpus) < run.item.world_size:
                continue
            run.gpus = tuple(free_gpus[:run.item.world_size])
            del free_gpus[:run.item.world_size]
        run.job = _submit_local(run.item, options, folder, run.gpus)
        active += 1


def _outcome_record(item: JobItem, job, options: LaunchOptions) -> dict:
    """Map a finished submitit job to a store record (never raises)."""
    reported = _reported(job)
    if reported is None:
        state = _state(job)
        status = _SLURM_STATUS.get(state.split()[0], "error")
        return _failure_record(item, options, status, f"job {job.job_id} ended {state} "
                               f"without a result{_stderr_tail(job)}", job)
    outcome, value = reported
    if outcome != "success":
        text = _tail(str(value))
        status = "timeout" if ("timed-out" in text or "TIMEOUT" in text) else "error"
        return _failure_record(item, options, status, text, job)
    if value is None:
        return _failure_record(item, options, "error", "no rank returned a result", job)
    if isinstance(value, dict):
        record = {name: getattr(item.plan, name) for name in PLAN_FIELDS}
        record.update({k: v for k, v in value.items() if k not in PLAN_FIELDS})
    else:
        record = store.result_record(value)
        record.update({name: getattr(item.plan, name) for name in PLAN_FIELDS})
    record.setdefault("status", "ok")
    record.update(_job_fields(job, options, item))
    return record


def _task_outcome(job, task: int):
    """(outcome, value) from a task's result pickle, or None if not written yet.

    Read directly (submitit.core.utils.pickle_load) because ``Job.result()`` of
    a LocalJob waits for every task of the job to exit."""
    from submitit.core.utils import pickle_load

    path = job.task(task).paths.result_pickle
    if not path.exists():
        return None
    try:
        return tuple(pickle_load(path))
    except Exception as exc:  # noqa: BLE001 - half-written or unreadable
        return ("error", f"unreadable result of task {task}: {type(exc).__name__}: {exc}")


def _reported(job):
    """Rank 0's outcome, else the first other rank that reported a failure."""
    first = _task_outcome(job, 0)
    if first is not None:
        return first
    for task in range(1, job.num_tasks):
        outcome = _task_outcome(job, task)
        if outcome is None:
            continue
        kind, value = outcome
        if kind != "success" or (value is not None and getattr(value, "status", "ok") != "ok"):
            return outcome
    return None


def _stderr_tail(job) -> str:
    try:
        text = job.task(0).stderr() or ""
    except Exception:  # noqa: BLE001
        return ""
    tail = _tail(text, 3)
    return f": {tail}" if tail else ""


def _failure_record(item: JobItem, options: LaunchOptions, status: str, error: str, job=None) -> dict:
    record = {name: getattr(item.plan, name) for name in PLAN_FIELDS}
    record.update(status=status, device=options.device, world_size=item.world_size,
                  step_time_s=None, tokens_per_s_per_gpu=None, model_tflops_per_gpu=None,
                  peak_memory_bytes=None, iteration_times_s=[], losses=[], error=error)
    record.update(_job_fields(job, options, item))
    return record


def _job_fields(job, options, item) -> dict:
    return {"executor": options.executor, "job_id": getattr(job, "job_id", None),
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


RANKS_GRACE_OK_S = 60.0
"""How long the other ranks may take to exit once rank 0 has reported success."""
RANKS_GRACE_FAILED_S = 5.0
"""...and after a failure, when they may hang in a collective."""


def _job_done(run: _Run) -> bool:
    """Done when the whole job has ended, or a rank has reported (rank 0's
    result, or another rank's failure) and the other ranks had a grace period
    to exit; then they are cancelled."""
    job = run.job
    reported = _reported(job)
    if reported is None:
        return job.done()
    if run.reported_at is None:
        run.reported_at = time.monotonic()
    if job.done():
        return True
    kind, value = reported
    ok = kind == "success" and value is not None and getattr(value, "status", "ok") == "ok"
    if time.monotonic() - run.reported_at < (RANKS_GRACE_OK_S if ok else RANKS_GRACE_FAILED_S):
        return False
    _cancel(job)
    return True


def _state(job) -> str:
    try:
        return str(job.state or "UNKNOWN").upper()
    except Exception:  # noqa: BLE001
        return "UNKNOWN"


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _first_line(text: str, skip: str = "") -> str:
    for line in str(text).splitlines():
        line = line.strip()
        if line and not (skip and line.startswith(skip)) and not line.startswith("-"):
            return line
    return str(text).strip()[:200]


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
    if result is not None and warned["hit"] and getattr(result, "status", "ok") != "ok":
        result = dataclasses.replace(result, status="timeout")
    return result


def _rendezvous(spec) -> dict:
    try:
        import submitit

        env = submitit.JobEnvironment()
        job_id = env.job_id
        host = env.hostnames[0] if env.num_nodes > 1 else spec.master_addr
    except RuntimeError:  # not under submitit
        return {}
    digits = "".join(ch for ch in str(job_id) if ch.isdigit()) or "0"
    return {"master_addr": host, "master_port": 20000 + int(digits) % 20000}


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


def probe_job(kind: str, seconds: float = 0.0, value: float = 1.0) -> dict:
    """A tiny stand-in job for testing the launch mechanics without torch:
    ``ok`` returns a result dict, ``raise`` raises, ``sleep`` sleeps ``seconds``
    then returns."""
    _watch_time_limit()
    if kind == "raise":
        raise RuntimeError(f"probe job asked to fail (value={value})")
    if seconds:
        time.sleep(seconds)
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("SUBMITIT_LOCAL_GLOBALID", "0")))
    if rank != 0:
        return None
    return {"status": "ok", "step_time_s": value, "tokens_per_s_per_gpu": 1000.0 / value,
            "iteration_times_s": [value], "losses": [], "error": "", "device": "cpu",
            "visible_gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "world_size": int(os.environ.get("SLURM_NTASKS", os.environ.get("SUBMITIT_LOCAL_NTASKS", "1")))}
