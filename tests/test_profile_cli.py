"""The issue's end-to-end profiling run, through the real CLI: a search of the
tiny model on 4 (CPU) ranks whose top-k plans run real megatron-core steps."""

import json
import subprocess
import sys

import pandas as pd
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profiled_search(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    out = tmp_path_factory.mktemp("tiny-search")
    proc = subprocess.run(
        [sys.executable, "-m", "autoconfig", "search", "--model", "tiny", "--gpus-per-node", "2",
         "--nodes", "1", "--device", "cpu", "--profile", "--executor", "local", "--top-k", "4",
         "--max-steps", "2", "--warmup-steps", "1", "-o", str(out)],
        capture_output=True, text=True, timeout=900)
    return proc, out


def test_exits_cleanly_and_reports_the_measured_ranking(profiled_search):
    proc, out = profiled_search
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert "Measured ranking" in proc.stdout
    assert "NOT GPU figures" in proc.stdout
    assert (out / "plans.csv").is_file() and (out / "profile" / "results.jsonl").is_file()


def test_top_k_plans_cover_the_plan_axes_and_all_ran(profiled_search):
    _, out = profiled_search
    records = [json.loads(line) for line in (out / "profile" / "results.jsonl").read_text()
               .splitlines() if line.strip()]
    assert len(records) == 4
    for record in records:
        assert record["status"] == "ok", record.get("error")
        assert record["device"] == "cpu" and record["step_time_s"] > 0
        assert len(record["losses"]) == 3  # 1 warm-up + 2 timed steps
    plans = [record["plan"] if "plan" in record else record for record in records]
    assert {1, 2} <= {p["tp"] for p in plans}
    assert {1, 2} <= {p["pp"] for p in plans}
    assert {True, False} == {bool(p["sp"]) for p in plans}
    # Every recompute kind the search kept is profiled (selective recompute of
    # the attention core spares nothing under fused attention: dominated, dropped).
    kinds = set(pd.read_csv(out / "plans.csv").recompute)
    assert {"none", "full"} <= kinds
    assert kinds == {p["recompute"] for p in plans}


def test_ranking_follows_measured_throughput(profiled_search):
    _, out = profiled_search
    report = pd.read_csv(out / "profile" / "profile_report.csv").sort_values("measured_rank")
    assert list(report["measured_rank"]) == [1, 2, 3, 4]
    rates = list(report["tokens_per_s_per_gpu"])
    assert rates == sorted(rates, reverse=True)


def test_cuda_on_a_machine_without_gpu_is_one_line_exit_2(tmp_path):
    from autoconfig.profiling.executors.local import local_gpu_visible
    if local_gpu_visible():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run(
        [sys.executable, "-m", "autoconfig", "search", "--model", "tiny", "--nodes", "1",
         "--gpus-per-node", "2", "--profile", "--device", "cuda", "-o", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: invalid --device cuda: no NVIDIA GPU is visible on this machine for the local "
        "executor; use --device cpu, or --executor slurm"]
    assert not (tmp_path / "out").exists()  # failed before the search wrote anything
