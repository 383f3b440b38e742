"""The results directory lock: one live sweep per folder; a stale lock is taken over."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoconfig.errors import BusyError
from autoconfig.profiling import store

ROOT = Path(__file__).resolve().parent.parent


def _write_lock(folder: Path, pid: int, host: str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / store.LOCK_FILE
    path.write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(),
                                "started_at": "2026-01-01T00:00:00Z"}))
    return path


def test_a_live_holder_is_refused_in_one_line(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        _write_lock(tmp_path, holder.pid)
        with pytest.raises(BusyError) as exc:
            with store.lock(tmp_path):
                pass
        assert "\n" not in str(exc.value) and f"pid {holder.pid}" in str(exc.value)
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_that_cannot_be_written_is_not_left_behind(tmp_path, monkeypatch):
    """A full disk creates the lock file but fails its write: the empty file
    would refuse the next run as "in use" though nothing holds the folder."""
    import errno

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(store.os, "fsync", full)
        with pytest.raises(OSError, match="No space left") as caught:
            with store.lock(tmp_path / "run"):
                pass
    assert caught.value.filename == str(tmp_path / "run" / store.LOCK_FILE)
    assert not (tmp_path / "run" / store.LOCK_FILE).exists()
    with store.lock(tmp_path / "run") as path:     # space freed: the next run goes on
        assert json.loads(path.read_text())["pid"] == os.getpid()


def test_an_empty_lock_is_named_as_being_written(tmp_path):
    (tmp_path / store.LOCK_FILE).write_text("")
    with pytest.raises(BusyError, match="its lock is being written now"):
        with store.lock(tmp_path):
            pass


def test_a_dead_holder_is_taken_over_and_released(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    path = _write_lock(tmp_path, dead.pid)
    with store.lock(tmp_path):
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert not path.exists()


def test_another_hosts_lock_is_not_taken(tmp_path):
    _write_lock(tmp_path, 1, host="some-other-host")
    with pytest.raises(BusyError, match="some-other-host"):
        with store.lock(tmp_path):
            pass


def test_folders_the_lock_created_are_removed_when_left_empty(tmp_path):
    with pytest.raises(RuntimeError):
        with store.lock(tmp_path / "out" / "profile"):
            raise RuntimeError("refused before anything was written")
    assert not (tmp_path / "out").exists()


SEARCH = ["-m", "autoconfig", "search", "--model", "tiny", "--gpus-per-node", "2", "--nodes", "1",
          "--tp", "1,2", "--pp", "1", "--device", "cpu", "--profile", "--executor", "local",
          "--top-k", "2", "--max-steps", "1", "--warmup-steps", "1", "--max-parallel", "1"]


@pytest.mark.slow
def test_two_sweeps_into_one_folder_then_kill_and_take_over(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    out = tmp_path / "out"
    results = out / "profile"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    started = time.monotonic()
    first = subprocess.Popen([sys.executable, *SEARCH, "-o", str(out)], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (results / store.LOCK_FILE).exists():
            time.sleep(0.2)
        assert (results / store.LOCK_FILE).exists(), "the first sweep never took the lock"
        second = subprocess.run([sys.executable, *SEARCH, "-o", str(out)], env=env,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 2
        assert second.stderr.count("\n") == 1 and "in use by another sweep" in second.stderr
        # wait for the first record, then kill -9 the first sweep and its jobs
        deadline = time.time() + 300
        while time.time() < deadline and not store.load_records(results):
            time.sleep(0.5)
        before = (results / store.RESULTS_FILE).read_text()
        assert before, "the first sweep wrote no record"
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    killed_at = time.monotonic()
    third = subprocess.run([sys.executable, *SEARCH, "-o", str(out)], env=env,
                           capture_output=True, text=True, timeout=600)
    assert third.returncode == 0, third.stderr[-2000:]
    after = (results / store.RESULTS_FILE).read_text()
    assert after.startswith(before)                      # no record lost
    latest = store.load_results(results)
    assert len(latest) == 2 and set(latest["status"]) == {"ok"}
    assert not (results / store.LOCK_FILE).exists()
    print(f"lock test: first sweep {killed_at - started:.1f} s, take-over run "
          f"{time.monotonic() - killed_at:.1f} s")


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path):
    """The lock names its process by pid and start time: a live process that got
    the dead sweep's pid (here: a live process with another start time) does not
    hold the folder."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        path = _write_lock(tmp_path, other.pid)
        data = json.loads(path.read_text())
        data["process_start"] = (store.process_start(other.pid) or 0) + 12345
        path.write_text(json.dumps(data))
        with store.lock(tmp_path):
            assert json.loads(path.read_text())["pid"] == os.getpid()
        # The same pid with its real start time is a live holder.
        data["process_start"] = store.process_start(other.pid)
        path.write_text(json.dumps(data))
        with pytest.raises(BusyError):
            with store.lock(tmp_path):
                pass
    finally:
        other.kill()
        other.wait()


def test_a_sweep_folder_is_locked(tmp_path):
    """Two `autoconfig sweep` runs into one folder: the second is refused in one line."""
    from autoconfig.sweep.run import run_sweep
    from autoconfig.sweep.spec import parse_sweep
    spec = parse_sweep({"name": "x", "matrix": {"model": [{"model": "gpt3", "size": "1.3b"}],
                                                 "gpu": ["a100-80gb"], "nodes": [1]}})
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        path = _write_lock(tmp_path, holder.pid)
        with pytest.raises(BusyError) as exc:
            run_sweep(spec, tmp_path)
        assert "\n" not in str(exc.value)
        assert not (tmp_path / "settings").exists()
        path.unlink()
        records = run_sweep(spec, tmp_path)
        assert records[0]["status"] == "ok" and not path.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_busy_setting_is_not_final(tmp_path, monkeypatch):
    """A setting that failed only because its folder was busy gets no record, so
    the next run runs it (it used to be final: 'error' for ever)."""
    from autoconfig.sweep import run as sweep_run
    from autoconfig.sweep.spec import parse_sweep
    spec = parse_sweep({"name": "x", "matrix": {"model": [{"model": "gpt3", "size": "1.3b"}],
                                                 "gpu": ["a100-80gb"], "nodes": [1]}})

    def busy(setting, calibration=None):
        raise BusyError("results directory x is in use by another sweep")
    monkeypatch.setattr(sweep_run, "_search", busy)
    records = sweep_run.run_sweep(spec, tmp_path, echo=lambda text: None)
    assert records[0]["status"] == "error"
    assert sweep_run.load_record(tmp_path, spec.settings[0]) is None
    monkeypatch.undo()
    records = sweep_run.run_sweep(spec, tmp_path)
    assert records[0]["status"] == "ok"
    assert sweep_run.load_record(tmp_path, spec.settings[0])["status"] == "ok"
