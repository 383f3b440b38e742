"""A sweep owns its jobs: SIGTERM cancels and records them; after kill -9 the
next sweep into the folder adopts (or cancels) what was left before submitting.

Both executors, with the probe job (no torch): the local one on this machine,
SLURM on the real single-node SLURM of the ``slurm`` fixture (tests/conftest.py).
"""

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autoconfig.core.plan import Plan
from autoconfig.profiling import launch, ownership, store
from autoconfig.profiling.launch import JobItem, LaunchOptions
from probe_jobs import probe_job

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

SWEEP = textwrap.dedent("""
    import sys
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from autoconfig.core.plan import Plan
    from autoconfig.profiling.launch import JobItem, LaunchOptions, launch
    from autoconfig.signals import Terminated, stop_cleanly
    from probe_jobs import probe_job
    plans = [Plan(tp=1, pp=1, dp=1, mbs=m) for m in (1, 2, 4)]
    seconds = [0.0, 0.0, float(sys.argv[4])]
    items = [JobItem(p, 1, probe_job, ("sleep", s, 1.0 + i)) for i, (p, s) in
             enumerate(zip(plans, seconds))]
    options = LaunchOptions(executor=sys.argv[2], time_limit_min=5, max_parallel=3,
                            job_name="ac-test-orphans", poll_s=0.2)
    try:
        with stop_cleanly():
            launch(items, options, Path(sys.argv[1]), progress=False)
    except Terminated as exc:
        sys.exit(128 + exc.signum)
""")
PLANS = [Plan(tp=1, pp=1, dp=1, mbs=m) for m in (1, 2, 4)]


def _start(tmp_path, executor, last_job_s):
    return subprocess.Popen([sys.executable, "-c", SWEEP, str(tmp_path), executor,
                             str(ROOT / "tests"), str(last_job_s)],
                            stderr=subprocess.DEVNULL, env=dict(os.environ))


def _wait_for_last_job(tmp_path, proc) -> dict:
    """The two quick plans recorded and the slow one's job written down: its handle."""
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        owned = ownership.load(tmp_path)
        if len(store.load_records(tmp_path)) == 2 and len(owned) == 1:
            return owned[0]
        time.sleep(0.2)
    pytest.fail(f"the slow job never showed up in {ownership.JOBS_FILE} (exit {proc.poll()})")


def _running(executor, handle) -> bool:
    if executor == "local":
        pid = int(handle["job_id"])
        return store.process_start(pid) == handle["pid_start"] and not store.is_zombie(pid)
    out = subprocess.run(["squeue", "-h", "-j", str(handle["job_id"]), "-o", "%T"],
                         capture_output=True, text=True).stdout.strip()
    return out not in ("", "COMPLETED", "CANCELLED")


def _gone(executor, handle, within_s=30.0) -> bool:
    deadline = time.time() + within_s
    while time.time() < deadline:
        if not _running(executor, handle):
            return True
        time.sleep(0.3)
    return False


def _orphan(tmp_path, executor, last_job_s) -> dict:
    """kill -9 a sweep while its slow job runs: the handle of the job it leaves."""
    proc = _start(tmp_path, executor, last_job_s)
    handle = _wait_for_last_job(tmp_path, proc)
    proc.kill()
    proc.wait(30)
    assert _running(executor, handle), "the orphan this test is about is not there"
    return handle


def _executor(request, name):
    if name == "slurm":
        request.getfixturevalue("slurm")
    return name


@pytest.mark.parametrize("name", ["local", "slurm"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_cancel_and_record_every_job(request, tmp_path, name, signum):
    executor = _executor(request, name)
    proc = _start(tmp_path, executor, 300)
    handle = _wait_for_last_job(tmp_path, proc)
    assert _running(executor, handle)
    proc.send_signal(signum)
    assert proc.wait(60) == 128 + signum
    assert _gone(executor, handle), f"job {handle['job_id']} still runs"
    latest = store.load_results(tmp_path).set_index("mbs")
    assert list(latest["status"]) == ["ok", "ok", "cancelled"]
    assert signal.Signals(signum).name in latest.loc[4, "error"]
    assert not (tmp_path / ownership.JOBS_FILE).exists()
    assert store.pending_plans(tmp_path, PLANS) == [PLANS[2]]    # a resume runs it again


@pytest.mark.parametrize("name", ["local", "slurm"])
def test_after_kill_9_the_next_sweep_adopts_the_running_job(request, tmp_path, name):
    executor = _executor(request, name)
    handle = _orphan(tmp_path, executor, 8)
    # the resumed sweep asks for the pending plan with a job that would say 9.0:
    # it must collect the orphan's result (3.0) instead of running it again
    records = launch.launch([JobItem(PLANS[2], 1, probe_job, ("ok", 0.0, 9.0))],
                            LaunchOptions(executor=executor, time_limit_min=5, poll_s=0.2,
                                          job_name="ac-test-orphans"),
                            tmp_path, progress=False)
    assert [(r["status"], r["step_time_s"], str(r["job_id"])) for r in records] == \
        [("ok", 3.0, str(handle["job_id"]))]
    assert _gone(executor, handle)                    # it ends on its own: collected
    assert store.pending_plans(tmp_path, PLANS) == []
    assert len(store.load_records(tmp_path)) == 3        # nothing lost, nothing twice
    assert not (tmp_path / ownership.JOBS_FILE).exists()


@pytest.mark.parametrize("name", ["local", "slurm"])
def test_a_leftover_job_no_plan_wants_is_cancelled(request, tmp_path, name):
    executor = _executor(request, name)
    handle = _orphan(tmp_path, executor, 300)
    launch.launch([], LaunchOptions(executor=executor, time_limit_min=5), tmp_path,
                  progress=False)
    assert _gone(executor, handle), f"job {handle['job_id']} still runs"
    assert not (tmp_path / ownership.JOBS_FILE).exists()


def test_an_unreadable_jobs_file_is_set_aside(tmp_path):
    (tmp_path / ownership.JOBS_FILE).write_text(json.dumps([1, 2]))
    assert ownership.load(tmp_path) == []
    assert (tmp_path / (ownership.JOBS_FILE + ownership.CORRUPT_SUFFIX)).exists()
    (tmp_path / ownership.JOBS_FILE).write_bytes(b"\xff\xfe{")
    assert ownership.load(tmp_path) == []


def test_the_cli_stops_on_sigterm_in_one_line(tmp_path):
    """``autoconfig`` turns SIGTERM into the Ctrl-C path: exit 128 + 15, one line."""
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "autoconfig", "sweep",
                             str(ROOT / "configs" / "sweeps" / "nightly-example.yaml"), "-o",
                             str(out), "--no-plots"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and \
            not list((out / "settings").glob("*.json")):
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before it could be stopped"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert lines == ["error: terminated by SIGTERM; started jobs were cancelled"]
    assert "Traceback" not in err


def test_a_full_disk_mid_sweep_leaves_no_job_running(tmp_path, monkeypatch):
    """The results file cannot take the first record: the sweep fails (the CLI
    says which file, one line) and the job still running is cancelled, not left."""
    real_append, owned = store.append_record, []

    def full_disk(out_dir, record):
        if record["status"] == "ok":
            raise OSError(errno.ENOSPC, "No space left on device", str(out_dir))
        real_append(out_dir, record)

    def remember(out_dir, entries):
        owned.extend(entries)
        real_save(out_dir, entries)
    real_save = ownership.save
    monkeypatch.setattr(store, "append_record", full_disk)
    monkeypatch.setattr(ownership, "save", remember)
    items = [JobItem(PLANS[0], 1, probe_job, ("ok", 0.0, 1.0)),
             JobItem(PLANS[1], 1, probe_job, ("sleep", 300.0, 2.0))]
    with pytest.raises(OSError):
        launch.launch(items, LaunchOptions(executor="local", max_parallel=2, poll_s=0.2),
                      tmp_path, progress=False)
    slow = next(h for h in owned if h["plan"]["mbs"] == PLANS[1].mbs)
    assert _gone("local", slow), f"job {slow['job_id']} still runs"
    # both plans are pending again (the finished one's result could not be stored)
    assert {r["status"] for r in store.load_records(tmp_path)} == {"cancelled"}
    assert store.pending_plans(tmp_path, PLANS[:2]) == PLANS[:2]
    assert not (tmp_path / ownership.JOBS_FILE).exists()


ROUNDS = ["-m", "autoconfig", "search", "--model", "tiny", "--gpus-per-node", "1", "--nodes", "1",
          "--device", "cpu", "--profile", "--top-k", "2", "--max-runs", "6", "--max-steps", "1",
          "--warmup-steps", "1", "--max-parallel", "2", "--no-plots"]


@pytest.mark.parametrize("name", ["local", "slurm"])
def test_a_round_based_search_killed_mid_round_resumes_losing_and_repeating_nothing(
        request, tmp_path, name):
    """CPU profiling in rounds (--max-runs 6, 2 per round), kill -9 while round 2
    runs, then the same command again: it adopts or re-runs what round 2 left and
    goes on to round 3; every plan is recorded once."""
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from autoconfig.profiling.rounds import load_rounds
    executor = _executor(request, name)
    out = tmp_path / "out"
    results = out / "profile"
    command = [sys.executable, *ROUNDS, "--executor", executor, "-o", str(out)]
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while time.time() < deadline and first.poll() is None:
        planned = [r for r in load_rounds(results) if r.get("planned")]
        if len(planned) == 2 and ownership.load(results):
            break
        time.sleep(0.2)
    assert first.poll() is None, "the search ended before round 2 could be interrupted"
    first.kill()
    first.wait(30)
    before = store.load_records(results)
    assert len(before) == 2
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    after = store.load_records(results)
    assert after[:2] == before                                        # nothing lost
    plans = [store.plan_from_record(r) for r in after]
    assert len(after) == 6 and len(set(plans)) == 6                   # nothing repeated
    assert {r["status"] for r in after} == {"ok"}
    numbers = [r["round"] for r in load_rounds(results) if r.get("planned")]
    assert numbers == [1, 2, 3]
    assert "run budget spent" in load_rounds(results)[-1]["stopped"]
    assert not (results / ownership.JOBS_FILE).exists()
