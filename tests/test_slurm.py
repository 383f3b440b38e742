"""Profiling jobs through submitit's SLURM executor on a real single-node SLURM.

The session fixture ``slurm`` (tests/conftest.py) starts one with the project's own script
(scripts/slurm-localhost.sh up: installs munge/slurm/mariadb with apt-get when
run as root, ~20-35 s the first time, ~1 s when already up) and skips when
that is not possible (not root and SLURM not installed).
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.cli import cli, main
from autoconfig.errors import LaunchError
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import Plan, Workload
from autoconfig.profiling import launch, store
from autoconfig.profiling.sweep import ProfileOptions, RankedPlan, run_profiling
from profile_probe import probe_command
from autoconfig.profiling.executors.slurm import KILLED_BY_WARNING, SlurmOptions
from autoconfig.profiling.launch import JobItem, LaunchOptions
from probe_jobs import probe_job

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow


def _items(*specs):
    """(plan, world size, probe args) -> JobItems."""
    return [JobItem(plan=p, world_size=w, fn=probe_job, args=a) for p, w, a in specs]


def _status(records):
    return {(r["tp"], r["pp"], r["dp"], r["mbs"]): r["status"] for r in records}


def test_ok_error_and_timeout_are_recorded(slurm, tmp_path):
    a, b, c = Plan(tp=1, pp=1, dp=1), Plan(tp=2, pp=1, dp=1), Plan(tp=1, pp=1, dp=2)
    items = _items((a, 1, ("ok", 0.0, 2.0)), (b, 2, ("raise",)), (c, 2, ("sleep", 300.0)))
    # A quick time-out: a 2 min limit with a 75 s warning delay, so SLURM warns
    # (USR2) at its first 30 s check after 45 s and submitit reports "timed-out".
    # The 45 s leave the jobs time to start Python and install submitit's handler
    # on a loaded machine (with 10 s, CI once saw every task killed by the
    # warning itself before the failing job could raise: see the next test).
    opts = LaunchOptions(executor="slurm", gpus_per_node=2, time_limit_min=2, signal_delay_s=75,
                         job_name="ac-test-basic")
    records = launch.launch(items, opts, tmp_path, progress=False)
    assert _status(records) == {(1, 1, 1, 1): "ok", (2, 1, 1, 1): "error", (1, 1, 2, 1): "timeout"}
    by_plan = {store.plan_from_record(r): r for r in store.load_records(tmp_path)}
    assert by_plan[a]["step_time_s"] == 2.0 and by_plan[a]["world_size"] == 1
    assert "probe job asked to fail" in by_plan[b]["error"]
    assert "timed-out" in by_plan[c]["error"]
    # two ranks on one node, as the plan asked
    script = (tmp_path / "jobs").glob("*_submission.sh")
    assert any("--ntasks-per-node=2" in s.read_text() for s in script)


def test_a_warning_before_the_handler_is_still_a_timeout(slurm, tmp_path):
    """SLURM's time-limit warning (USR2) kills a task that has no handler for it
    yet (Python still starting, on a loaded node). The job hit its limit: it is
    recorded as a time-out, not an error. The probe restores USR2's default
    action so the warning kills it, as it does a job that is still starting."""
    plan = Plan(tp=1, pp=1, dp=1)
    opts = LaunchOptions(executor="slurm", gpus_per_node=1, time_limit_min=1, signal_delay_s=50,
                         job_name="ac-test-early-warning")
    records = launch.launch(_items((plan, 1, ("unhandled", 300.0))), opts, tmp_path,
                            progress=False)
    assert _status(records) == {(1, 1, 1, 1): "timeout"}
    error = records[0]["error"]
    assert KILLED_BY_WARNING in error
    assert error.splitlines()[-1].startswith("TIMEOUT: job ")


def test_scancel_is_recorded_as_cancelled(slurm, tmp_path):
    plan = Plan(tp=1, pp=1, dp=1)
    opts = LaunchOptions(executor="slurm", gpus_per_node=1, time_limit_min=5,
                         job_name="ac-test-cancel")
    out = {}
    thread = threading.Thread(target=lambda: out.update(records=launch.launch(
        _items((plan, 1, ("sleep", 300.0))), opts, tmp_path, progress=False)))
    thread.start()
    job_id = ""
    deadline = time.time() + 60
    while not job_id and time.time() < deadline:
        job_id = subprocess.run(["squeue", "-h", "-n", "ac-test-cancel", "-o", "%i"],
                                capture_output=True, text=True).stdout.strip()
        time.sleep(0.3)
    assert job_id, "the job never showed up in squeue"
    subprocess.run(["scancel", job_id], check=True)
    thread.join(120)
    assert not thread.is_alive()
    assert [r["status"] for r in out["records"]] == ["cancelled"]
    # the line the report shows says what happened, not submitit's signal chatter
    assert out["records"][0]["error"].splitlines()[-1].startswith("CANCELLED")
    assert store.pending_plans(tmp_path, [plan]) == [plan]   # a resume runs it again


def test_a_job_gets_its_whole_time_budget(slurm, tmp_path):
    """--max-minutes 1 used to stop a job after ~28 s (the warning came a quarter
    of the limit early, and slurmctld checks signals every ~30 s)."""
    plan = Plan(tp=1, pp=1, dp=1)
    opts = LaunchOptions(executor="slurm", gpus_per_node=1, time_limit_min=1,
                         job_name="ac-test-budget", poll_s=0.5)
    started = time.monotonic()
    records = launch.launch(_items((plan, 1, ("sleep", 50.0, 2.0))), opts, tmp_path,
                            progress=False)
    assert [r["status"] for r in records] == ["ok"], records[0]["error"]
    assert time.monotonic() - started >= 50


def test_default_limit_is_the_budget_plus_a_grace_warned_at_the_budget():
    from autoconfig.profiling.executors import create
    from autoconfig.profiling.executors.slurm import SIGNAL_GRACE_MIN
    params = create(LaunchOptions(executor="slurm", time_limit_min=7)).parameters(1)
    assert params["time"] == 7 + SIGNAL_GRACE_MIN
    assert params["time"] * 60 - params["signal_delay_s"] >= 7 * 60 + 30   # >= budget + 1 check


def test_an_unreachable_controller_is_reported_while_waiting(monkeypatch, capsys):
    from autoconfig.profiling.executors import create, slurm as slurm_executor
    answers = iter([False, False, True])
    monkeypatch.setattr(slurm_executor, "controller_reachable", lambda: next(answers))
    monkeypatch.setattr(slurm_executor, "PING_EVERY_S", 0.0)
    executor = create(LaunchOptions(executor="slurm"))
    for _ in range(3):
        executor._watch_controller()
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" for ")[0] for line in lines[:2]] == ["[profile] SLURM unreachable"] * 2
    assert "still waiting" in lines[1] and "reachable again" in lines[2]


SWEEP = textwrap.dedent("""
    import signal
    import sys
    from pathlib import Path
    # Ctrl-C at a terminal reaches the search; a suite run as a background job of a
    # shell (``pytest &``) hands its children SIGINT ignored, so take it back.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from autoconfig.core.plan import Plan
    sys.path.insert(0, sys.argv[2])
    from autoconfig.profiling.launch import JobItem, LaunchOptions, launch
    from probe_jobs import probe_job
    plans = [Plan(tp=1, pp=1, dp=1, mbs=m) for m in (1, 2, 4)]
    seconds = [0.0, 0.0, 300.0]
    items = [JobItem(p, 1, probe_job, ("sleep", s, 1.0 + i)) for i, (p, s) in
             enumerate(zip(plans, seconds))]
    launch(items, LaunchOptions(executor="slurm", time_limit_min=5, job_name="ac-test-resume",
                                poll_s=0.3), Path(sys.argv[1]))
""")


def test_interrupted_sweep_resumes_without_rerunning_finished_plans(slurm, tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SWEEP, str(tmp_path), str(ROOT / "tests")],
                            stderr=subprocess.DEVNULL, env=dict(os.environ))
    results = tmp_path / store.RESULTS_FILE
    deadline = time.time() + 90
    while time.time() < deadline and len(store.load_records(tmp_path)) < 2:
        time.sleep(0.3)
    proc.send_signal(signal.SIGINT)          # Ctrl-C on the search
    assert proc.wait(60) != 0
    records = store.load_records(tmp_path)
    statuses = sorted(r["status"] for r in records)
    assert statuses == ["cancelled", "ok", "ok"], statuses
    plans = [Plan(tp=1, pp=1, dp=1, mbs=m) for m in (1, 2, 4)]
    pending = store.pending_plans(tmp_path, plans)
    assert pending == [plans[2]]
    first_jobs = {r["job_id"] for r in records if r["status"] == "ok"}
    # resume: only the unfinished plan is submitted again (now quick)
    launch.launch(_items((plans[2], 1, ("ok", 0.0, 3.0))),
                  LaunchOptions(executor="slurm", time_limit_min=5, job_name="ac-test-resume"),
                  tmp_path, progress=False)
    records = store.load_records(tmp_path)
    assert len(records) == 4 and results.read_text().count("\n") == 4
    assert store.pending_plans(tmp_path, plans) == []
    latest = store.load_results(tmp_path).set_index("mbs")
    assert latest.loc[4, "status"] == "ok" and latest.loc[4, "step_time_s"] == 3.0
    assert {r["job_id"] for r in records[:3] if r["status"] == "ok"} == first_jobs


def test_real_worker_profiles_a_plan_on_slurm(slurm, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    model = get_model("tiny")
    cluster = Cluster(gpu=get_gpu("h100-80gb"), nodes=1, gpus_per_node=2)
    workload = Workload(global_batch_size=4, seq_len=model.seq_len)
    plan = Plan(tp=2, pp=1, dp=1, sp=True, recompute="selective")
    options = ProfileOptions(profile=True, top_k=1, max_steps=1, warmup_steps=1,
                             launch=LaunchOptions(executor="slurm", device="cpu", time_limit_min=5))
    lines = []
    out = run_profiling([RankedPlan(plan, 0.01, 1e5, 1.0)], model, workload, cluster, options,
                        tmp_path, echo=lambda text, err=False: lines.append(text))
    [record] = store.load_records(out)
    assert record["status"] == "ok", record["error"]
    assert record["executor"] == "slurm" and record["world_size"] == 2
    assert record["step_time_s"] > 0 and len(record["losses"]) == 2
    assert "not gpu figures" in "\n".join(lines).lower()
    assert (out / "profile_report.md").exists()


def test_real_worker_profiles_an_expert_parallel_plan_on_slurm(slurm, tmp_path):
    """tiny-moe with EP 2 on 2 SLURM tasks; the stack asks for DeepEP (CUDA only),
    so the CPU job runs alltoall and its record says so."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from autoconfig.training.stack import SoftwareFeatures

    model = get_model("tiny-moe")
    cluster = Cluster(gpu=get_gpu("h100-80gb"), nodes=1, gpus_per_node=2)
    workload = Workload(global_batch_size=4, seq_len=model.seq_len)
    plan = Plan(tp=1, pp=1, dp=2, ep=2)
    options = ProfileOptions(profile=True, top_k=1, max_steps=1, warmup_steps=1,
                             launch=LaunchOptions(executor="slurm", device="cpu", time_limit_min=5))
    out = run_profiling([RankedPlan(plan, 0.01, 1e5, 1.0)], model, workload, cluster, options,
                        tmp_path, echo=lambda text, err=False: None,
                        software=SoftwareFeatures(moe_dispatcher="flex-deepep"))
    [record] = store.load_records(out)
    assert record["status"] == "ok", record["error"]
    assert record["executor"] == "slurm" and record["world_size"] == 2 and record["ep"] == 2
    assert record["step_time_s"] > 0 and record["peak_memory_bytes"] > 0
    assert record["moe_dispatcher"] == "alltoall" and "flex-deepep needs CUDA" in record["run_notes"]


def test_dry_run_prints_sbatch_scripts_without_submitting(tmp_path):
    model = get_model("tiny")
    cluster = Cluster(gpu=get_gpu("h100-80gb"), nodes=2, gpus_per_node=4)
    workload = Workload(global_batch_size=16, seq_len=model.seq_len)
    plans = [RankedPlan(Plan(tp=4, pp=2, dp=1)), RankedPlan(Plan(tp=2, pp=2, dp=2)),
             RankedPlan(Plan(tp=2, pp=1, dp=2, sp=True))]
    options = ProfileOptions(profile=True, top_k=3, dry_run=True, launch=LaunchOptions(
        executor="slurm", device="cuda", time_limit_min=20, max_parallel=2,
        backend=SlurmOptions(partition="gpu", account="proj", qos="high",
                             extra=(("constraint", "h100"),))))
    lines = []
    assert run_profiling(plans, model, workload, cluster, options, tmp_path,
                         echo=lambda text, err=False: lines.append(text)) is None
    text = "\n".join(lines)
    assert text.count("#!/bin/bash") == 2        # one array of 8-GPU plans, one 4-GPU job
    # --time: the 20-minute budget plus the 2-minute grace in which the job is warned
    for flag in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--partition=gpu",
                 "--account=proj", "--qos=high", "--time=22", "--constraint=h100",
                 "--array=0-1%2", "--job-name=autoconfig-profile", "srun"):
        assert flag in text, flag
    assert not any(tmp_path.iterdir())           # nothing written


_probe_cmd = probe_command("profile-probe", Plan(tp=2, pp=1, dp=1), gpus_per_node=2, global_batch_size=4)


def _run_cli(args, capsys):
    cli.add_command(_probe_cmd)
    try:
        with pytest.raises(SystemExit) as exc:
            main(args)
    finally:
        cli.commands.pop("profile-probe", None)
    return exc.value.code, capsys.readouterr()


def test_missing_sbatch_is_one_line_exit_2_and_store_untouched(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    out = tmp_path / "out"
    code, captured = _run_cli(["profile-probe", "--profile", "--executor", "slurm",
                               "--device", "cpu", "-o", str(out)], capsys)
    assert code == 2
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: SLURM is unreachable")
    assert "sbatch" in captured.err and "Traceback" not in captured.err
    assert not out.exists()


def test_sbatch_rejecting_the_job_is_one_line_exit_2(slurm, tmp_path, capsys):
    out = tmp_path / "out"
    code, captured = _run_cli(["profile-probe", "--profile", "--executor", "slurm", "--device",
                               "cpu", "--partition", "no-such-partition", "-o", str(out)], capsys)
    assert code == 2
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("error: SLURM rejected the job") and "partition" in captured.err
    assert not out.exists()


def test_capacity_check_raises_before_anything_is_written(tmp_path):
    opts = LaunchOptions(executor="slurm", gpus_per_node=4, nodes=1)
    with pytest.raises(LaunchError, match="needs 8 GPUs"):
        launch.launch(_items((Plan(tp=4, pp=2, dp=1), 8, ("ok",))), opts, tmp_path / "x")
    assert not (tmp_path / "x").exists()
