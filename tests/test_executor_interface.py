"""The executor interface is enough to add a backend: an executor defined here
(jobs run in threads of this process), registered by name, runs a profiling
sweep through the real sweep code (selection, lock, store, resume, report)."""

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ClassVar

import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import Plan, Workload
from autoconfig.errors import InputError, ProfilingError
from autoconfig.profiling import executors, launch, store
from autoconfig.profiling.executors.base import Executor
from autoconfig.profiling.launch import LaunchOptions
from autoconfig.profiling.spec import ProfileResult, ProfileSpec
from autoconfig.profiling.sweep import ProfileOptions, RankedPlan, run_profiling


@dataclass(frozen=True)
class ThreadOptions:
    FLAGS: ClassVar[tuple[str, ...]] = ()
    workers: int = 2

    @classmethod
    def from_flags(cls, **flags):
        return cls()


class ThreadExecutor(Executor):
    """Runs each job's function once, in a thread (rank 0 only)."""

    name = "threads"
    Options = ThreadOptions
    submitted: ClassVar[list] = []

    def capacity(self) -> int:
        return self.options.gpus_per_node

    def submit(self, runs, folder) -> None:
        self.pool = ThreadPoolExecutor(self.backend.workers)
        for run in runs:
            run.job = self.pool.submit(run.item.fn, *run.item.args)
            ThreadExecutor.submitted.append(run.item.plan)

    def outcome(self, job):
        if not job.done():
            return None
        if job.exception() is not None:
            return ("error", f"{type(job.exception()).__name__}: {job.exception()}")
        return ("success", job.result())

    def finished(self, job) -> bool:
        return job.done()

    def state(self, job) -> str:
        return "FINISHED" if job.done() else "RUNNING"

    def cancel(self, job) -> None:
        job.cancel()

    def dry_run(self, items, folder, echo, label) -> None:
        for item in items:
            echo(f"# threads: {label(item.plan)}")


def fake_profile_job(spec_json: str):
    """Stands in for the megatron-core worker: more TP, slower; tp=4 raises."""
    spec = ProfileSpec.from_json(spec_json)
    if spec.plan.tp == 4:
        raise RuntimeError("tp=4 is broken here")
    step = 0.1 * spec.plan.tp
    return store.result_record(ProfileResult(plan=spec.plan, status="ok", device=spec.device,
                         world_size=spec.world_size, step_time_s=step, iteration_times_s=(step,),
                         tokens_per_s_per_gpu=1000 / step, model_tflops_per_gpu=1.0,
                         peak_memory_bytes=1 << 20, losses=(5.0,), model_name=spec.model.name))


@pytest.fixture
def threads(monkeypatch):
    executors.register(ThreadExecutor)
    monkeypatch.setattr(launch, "profile_job", fake_profile_job)
    ThreadExecutor.submitted.clear()
    yield
    executors.unregister("threads")


PLANS = [Plan(tp=1, pp=1, dp=4), Plan(tp=2, pp=1, dp=2), Plan(tp=4, pp=1, dp=1)]


def _sweep(tmp_path, top_k=3, plans=PLANS):
    model = get_model("tiny")
    cluster = Cluster(gpu=get_gpu("h100-80gb"), nodes=1, gpus_per_node=4)
    workload = Workload(global_batch_size=8, seq_len=model.seq_len)
    options = ProfileOptions(profile=True, top_k=top_k, launch=LaunchOptions(
        executor="threads", device="cpu", poll_s=0.01, backend=ThreadOptions(workers=2)))
    lines = []
    out = run_profiling([RankedPlan(p) for p in plans], model, workload, cluster, options,
                        tmp_path, echo=lambda text, err=False: lines.append(text))
    return out, lines


def test_a_registered_executor_runs_a_sweep_through_the_real_sweep_code(threads, tmp_path):
    assert "threads" in executors.names()
    out, lines = _sweep(tmp_path)
    by_plan = {store.plan_from_record(r): r for r in store.load_records(out)}
    assert set(by_plan) == set(PLANS)
    assert by_plan[PLANS[0]]["status"] == "ok" and by_plan[PLANS[0]]["executor"] == "threads"
    assert by_plan[PLANS[2]]["status"] == "error"
    assert "tp=4 is broken here" in by_plan[PLANS[2]]["error"]
    assert json.loads((out / store.META_FILE).read_text())["executor"] == "threads"
    assert "Measured ranking" in "\n".join(lines)
    assert not (out / store.LOCK_FILE).exists()      # released
    # resume: the finished plans are not submitted again
    ThreadExecutor.submitted.clear()
    _sweep(tmp_path)
    assert ThreadExecutor.submitted == []


def test_no_successful_plan_is_an_error_naming_the_cause(threads, tmp_path):
    with pytest.raises(ProfilingError, match="tp=4 is broken here") as exc:
        _sweep(tmp_path, top_k=1, plans=[Plan(tp=4, pp=1, dp=1)])
    assert "\n" not in str(exc.value) and "--device cpu" not in str(exc.value)


def test_unknown_executor_names_the_registered_ones():
    with pytest.raises(InputError, match="allowed are local, replay, slurm"):
        LaunchOptions(executor="nope")


def test_backend_options_of_another_executor_are_refused():
    from autoconfig.profiling.executors.slurm import SlurmOptions

    with pytest.raises(InputError, match="expected LocalOptions"):
        executors.create(dataclasses.replace(LaunchOptions(), backend=SlurmOptions()))
