"""A tiny stand-in job for testing the launch mechanics without torch.

Registered with cloudpickle to travel by value, so a SLURM job's Python (which
does not have tests/ on its path) can run it.
"""

import os
import time

import cloudpickle

from autoconfig.core.plan import Plan
from autoconfig.profiling.launch import _watch_time_limit
from autoconfig.profiling.spec import ProfileResult


def probe_job(kind: str, seconds: float = 0.0, value: float = 1.0, plan: Plan | None = None):
    """``ok`` returns a result, ``raise`` raises, ``sleep`` sleeps ``seconds``
    then returns. The result's model_name records the visible GPUs
    ("probe:<CUDA_VISIBLE_DEVICES>"); ranks other than 0 return None."""
    _watch_time_limit()
    if kind == "raise":
        raise RuntimeError(f"probe job asked to fail (value={value})")
    if seconds:
        time.sleep(seconds)
    rank = int(os.environ.get("SLURM_PROCID", os.environ.get("SUBMITIT_LOCAL_GLOBALID", "0")))
    if rank != 0:
        return None
    world_size = int(os.environ.get("SLURM_NTASKS", os.environ.get("SUBMITIT_LOCAL_NTASKS", "1")))
    return ProfileResult(
        plan=plan or Plan(tp=1, pp=1, dp=1), status="ok", device="cpu", world_size=world_size,
        step_time_s=value, iteration_times_s=(value,), tokens_per_s_per_gpu=1000.0 / value,
        model_tflops_per_gpu=None, peak_memory_bytes=None, losses=(),
        model_name=f"probe:{os.environ.get('CUDA_VISIBLE_DEVICES', '')}")


def visible_gpus(record: dict) -> str:
    return record["model_name"].split(":", 1)[1]


cloudpickle.register_pickle_by_value(__import__(__name__))
