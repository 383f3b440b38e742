"""A tiny stand-in job for testing the launch mechanics without torch.

Registered with cloudpickle to travel by value, so a SLURM job's Python (which
does not have tests/ on its path) can run it.
"""

import os
import signal
import time

import cloudpickle

from autoconfig.profiling.launch import _watch_time_limit


def probe_job(kind: str, seconds: float = 0.0, value: float = 1.0) -> dict | None:
    """``ok`` returns a record, ``raise`` raises, ``sleep`` sleeps ``seconds``
    then returns, ``unhandled`` sleeps with USR2's default action restored (a
    job whose time-limit warning comes before any handler is installed); ranks
    other than 0 return None."""
    _watch_time_limit()
    if kind == "unhandled":
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
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
            "world_size": int(os.environ.get("SLURM_NTASKS",
                                             os.environ.get("SUBMITIT_LOCAL_NTASKS", "1")))}


cloudpickle.register_pickle_by_value(__import__(__name__))
