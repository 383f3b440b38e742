"""Test helper: run the profiling worker's ranks as plain local processes
(torchrun-style environment), without submitit, and return rank 0's result."""

import contextlib
import json
import multiprocessing
import os
import signal
import socket
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


# The ranks are forked from one server process that has imported torch, megatron-core
# and the worker once (multiprocessing's forkserver with a preload list): a fresh
# interpreter per rank spends ~8 s of CPU on those imports alone, which over the
# suite's multi-rank runs was minutes of a 2-core CI machine. Each rank is still its
# own process with its own torch.distributed group; the server itself never runs a
# step, so no thread or device state is inherited.
_PRELOAD = ["torch", "torch.distributed", "megatron.core.models.gpt.gpt_model",
            "megatron.core.optimizer", "megatron.core.distributed",
            "megatron.core.pipeline_parallel", "autoconfig.profiling.worker",
            "autoconfig.profiling.cpu_bridge"]
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(_PRELOAD)


class _Rank:
    """A forked rank seen through the little of ``subprocess.Popen`` the helpers use."""

    def __init__(self, process) -> None:
        self.process = process
        self.pid = process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        self.process.join(timeout)
        return self.process.exitcode


def _rank_main(env: dict, argv: list[str], log_path: str) -> None:
    """One rank in the forked child: its own session (so the group can be killed),
    its output in its log, the torchrun-style environment, then the worker's main."""
    os.setsid()
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.update(env)
    from autoconfig.profiling import worker

    code = worker.main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _start_ranks(spec: ProfileSpec, world_size: int, out: Path) -> list:
    port = _free_port()
    argv = ["--spec-json", spec.to_json(), "--result-dir", str(out)]
    procs = []
    for rank in range(world_size):
        # no OMP_NUM_THREADS: the server's OpenMP runtime is already up, so the worker
        # sets its share of the cores itself (torch.set_num_threads, by LOCAL_WORLD_SIZE)
        env = dict(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))
        process = _CONTEXT.Process(target=_rank_main,
                                   args=(env, argv, str(out / f"rank{rank}.log")), daemon=False)
        process.start()
        procs.append(_Rank(process))
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
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)   # a rank killed before its setsid
    with contextlib.suppress(Exception):
        proc.wait(timeout=10)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
