"""`autoconfig infer --profile`: real megatron-core static inference on the CPU proxy."""

import subprocess
import sys

import pandas as pd
import pytest

from autoconfig.cli import main
from autoconfig.profiling import store

ARGS = ["infer", "--model", "tiny", "--gpu", "h100", "--gpus", "4", "--gpus-per-node", "4",
        "--input-len", "16", "--output-len", "8", "--no-plots", "--top", "3"]


def test_dry_run_lists_the_jobs_and_runs_nothing(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(ARGS + ["--profile", "--device", "cpu", "--dry-run", "--top-k", "3",
                     "-o", str(tmp_path)])
    captured = capsys.readouterr()
    assert info.value.code == 0
    assert "dry run: 3 job(s)" in captured.err
    assert not (tmp_path / "profile" / store.RESULTS_FILE).exists()


@pytest.mark.slow
def test_profile_runs_real_inference_for_three_layouts_ranked_by_measured_latency(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    proc = subprocess.run([sys.executable, "-m", "autoconfig", *ARGS, "--profile", "--device",
                           "cpu", "--executor", "local", "--top-k", "3", "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ranked by measured latency" in proc.stdout
    results = tmp_path / "profile"
    records = store.load_records(results)
    assert len(records) == 3 and all(r["status"] == "ok" for r in records), records
    assert len({(r["tp"], r["pp"]) for r in records}) == 3
    for record in records:
        assert record["device"] == "cpu" and record["world_size"] == record["tp"] * record["pp"]
        assert record["measured_ttft_ms"] > 0 and record["measured_tpot_ms"] > 0
        assert len(record["step_times_s"]) == 8          # prefill + 7 decode steps
    table = pd.read_csv(results / "infer_profile.csv")
    assert list(table["measured_latency_ms"]) == sorted(table["measured_latency_ms"])
    assert {"predicted_latency_ms", "predicted_ttft_ms", "predicted_tpot_ms"} <= set(table)
    # The same command again resumes: every layout has its final record, nothing reruns,
    # and the report is rebuilt from what the store holds.
    again = subprocess.run([sys.executable, "-m", "autoconfig", *ARGS, "--profile", "--device",
                            "cpu", "--executor", "local", "--top-k", "3", "-o", str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume: 3 layout(s) already have a final record" in again.stdout + again.stderr
    assert len(store.load_records(results)) == 3
    rebuilt = pd.read_csv(results / "infer_profile.csv")
    assert list(rebuilt["measured_latency_ms"]) == list(table["measured_latency_ms"])


def test_gpu_report_says_what_ran_beside_what_was_predicted() -> None:
    """The worker runs megatron-core's static path whatever --engine says: a GPU
    report names both (on an H100 its eager steps measured 27-38 ms per token
    where the vllm or megatron-core engines predict 3-10: benchmarks/gpu/)."""
    from autoconfig.profiling.inference_sweep import WORKER_ENGINE, WORKER_ENGINE_NAME, render
    table = pd.DataFrame([{"tp": 1, "pp": 1, "batch": 8, "run_batch": 8, "status": "ok",
                           "measured_ttft_ms": 31.2, "predicted_ttft_ms": 21.4,
                           "measured_tpot_ms": 41.0, "predicted_tpot_ms": 2.6,
                           "measured_latency_ms": 2624.0, "predicted_latency_ms": 184.9,
                           "predicted_rank": 1, "error": ""}])
    text = render(table, "cuda", "vllm")
    assert WORKER_ENGINE in text and "the vllm engine" in text
    assert f"--engine {WORKER_ENGINE_NAME} predicts what the worker runs" in text
    assert "CPU proxy" in render(table, "cpu", "vllm")
    assert WORKER_ENGINE not in render(table, "cuda")
    # predicted for the engine the worker runs: nothing to caution about
    same = render(table, "cuda", WORKER_ENGINE_NAME)
    assert "measured and predicted: " + WORKER_ENGINE in same and "order more" not in same
