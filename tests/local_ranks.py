"""Test helper: run the profiling worker's ranks as plain local processes
(torchrun-style environment), without submitit, and return rank 0's result."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autoconfig.profiling.spec import ProfileResult, ProfileSpec
from autoconfig.profiling.worker import ERROR_TAIL_LINES



def run_local_processes(spec: ProfileSpec, world_size: int, timeout_s: float) -> ProfileResult:
    """Start ``world_size`` ranks as local processes (torchrun-style env) and return rank 0's result.

    A rank that fails ends the job at once with its own record; past ``timeout_s``
    every rank is killed and the record says "timeout".
    """
    with tempfile.TemporaryDirectory(prefix="autoconfig-profile-") as folder:
        out = Path(folder)
        procs = _start_ranks(spec, world_size, out)
        deadline = time.monotonic() + timeout_s
        try:
            return _wait_for_ranks(spec, world_size, procs, out, deadline, timeout_s)
        finally:
            for proc in procs:
                _kill_group(proc)


def _start_ranks(spec: ProfileSpec, world_size: int, out: Path) -> list:
    port = _free_port()
    threads = max(1, (os.cpu_count() or 1) // world_size)
    procs = []
    for rank in range(world_size):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        if spec.device == "cpu":
            env.setdefault("OMP_NUM_THREADS", str(threads))
        log = open(out / f"rank{rank}.log", "wb")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "autoconfig.profiling.worker", "--spec-json", spec.to_json(),
             "--result-dir", str(out)],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()
    return procs


def _wait_for_ranks(spec, world_size, procs, out: Path, deadline: float, timeout_s: float):
    while True:
        codes = [proc.poll() for proc in procs]
        first_failure = next((r for r, c in enumerate(codes) if c not in (None, 0)), None)
        if all(c is not None for c in codes) or first_failure is not None:
            if first_failure is not None and codes[0] is None:
                time.sleep(1.0)   # give rank 0 a moment to record its own view
            return _collect(spec, world_size, out, codes, first_failure)
        if time.monotonic() > deadline:
            return ProfileResult.failed(
                spec, "timeout", f"no result after {timeout_s:g} s; rank 0 log tail:\n"
                + _log_tail(out / "rank0.log"), world_size)
        time.sleep(0.2)


def _collect(spec, world_size, out: Path, codes, first_failure) -> ProfileResult:
    for rank in [0] + ([first_failure] if first_failure else []):
        path = out / f"result-rank{rank}.json"
        if path.exists():
            result = ProfileResult.from_dict(json.loads(path.read_text()))
            if rank == 0 and result.status == "ok" and first_failure is not None:
                continue
            return result
    rank = first_failure if first_failure is not None else 0
    return ProfileResult.failed(
        spec, "error", f"rank {rank} exited with code {codes[rank]} and no record; log tail:\n"
        + _log_tail(out / f"rank{rank}.log"), world_size)


def _log_tail(path: Path) -> str:
    if not path.exists():
        return ""
    lines = path.read_text(errors="replace").strip().splitlines()
    return "\n".join(lines[-ERROR_TAIL_LINES:])


def _kill_group(proc) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
