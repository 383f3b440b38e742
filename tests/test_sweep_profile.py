"""A profiled sweep through the real CLI (CPU worker, local executor, tiny model,
2 settings), killed mid-way with SIGKILL and resumed: completed settings are
not run again and no record is lost."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from autoconfig.profiling import store
from autoconfig.sweep.run import PROFILES_DIR, SETTINGS_DIR

SWEEP = """
name: profiled-tiny
gpus_per_node: 2
matrix:
  model: [tiny]
  gpu: [h100]
  nodes: [1]
  gbs: [4, 8]
  mode: [profile]
profile: {device: cpu, executor: local, top_k: 1, max_steps: 1, warmup_steps: 1,
          max_minutes: 5, max_parallel: 1}
"""


def _profile_records(out: Path) -> dict[str, list]:
    return {d.name: store.load_records(d / "profile")
            for d in sorted((out / PROFILES_DIR).glob("*"))}


@pytest.mark.slow
def test_killed_profiled_sweep_resumes_without_rerunning_or_losing_records(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP)
    out = tmp_path / "run"
    command = [sys.executable, "-m", "autoconfig", "sweep", str(sweep), "-o", str(out),
               "--no-plots"]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if list((out / SETTINGS_DIR).glob("*.json")):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the sweep ended before it could be killed: " + \
        proc.stdout.read().decode()
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()

    [first] = list((out / SETTINGS_DIR).glob("*.json"))
    first_bytes = first.read_bytes()
    assert json.loads(first_bytes)["status"] == "ok"
    assert not (out / "sweep.csv").exists()
    before = _profile_records(out)
    first_profile = first.stem
    assert len(before[first_profile]) == 1

    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "autoconfig", "sweep", str(sweep), "--resume",
                           str(out), "--no-plots"], capture_output=True, text=True, timeout=600)
    print(f"resumed sweep: {time.monotonic() - start:.1f} s")
    assert done.returncode == 0, done.stdout + done.stderr
    assert first.read_bytes() == first_bytes                 # not run again
    after = _profile_records(out)
    assert after[first_profile] == before[first_profile]    # its profiling not run again
    records = [json.loads(p.read_text()) for p in sorted((out / SETTINGS_DIR).glob("*.json"))]
    assert len(records) == 2 and {r["status"] for r in records} == {"ok"}
    for record in records:
        assert record["measured"]["tokens_per_s_per_gpu"] > 0
    for name, recs in after.items():                        # every plan has its final record
        assert [r["status"] for r in recs][-1] == "ok", name
    df = pd.read_csv(out / "sweep.csv")
    assert len(df) == 2 and df["measured_tokens_per_s_per_gpu"].notna().all()
    assert json.loads((out / "manifest.json").read_text())["resumed"]
    assert not list(out.rglob("*.png"))                     # --no-plots, profiles included
