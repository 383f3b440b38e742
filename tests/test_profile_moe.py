"""End-to-end MoE profiling search on CPU, through the command a user types:
``autoconfig search --model tiny-moe ... --profile --device cpu`` on 4 CPU ranks;
the selected plans, expert-parallel ones among them, run real megatron-core steps
with the stack's token dispatcher.
"""

import json

import pandas as pd
import pytest

from autoconfig.profiling import store
from tests.cli_runner import cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profiled_moe_search(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    out = tmp_path_factory.mktemp("tiny-moe-search")
    # mbs 1 and gbs 8 keep each job to seconds; the nemo stack runs the alltoall
    # dispatcher and asks for grouped GEMM (which needs CUDA: noted in the record).
    proc = cli("search", "--model", "tiny-moe", "--gpu", "h100", "--gpus-per-node", "4",
               "--nodes", "1", "--gbs", "8", "--mbs", "1", "--stack", "nemo", "--profile",
               "--device", "cpu", "--executor", "local", "--top-k", "2", "--max-steps", "2",
               "--warmup-steps", "1", "--no-plots", "-o", out, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "profile", proc.stdout


def test_moe_search_profiles_expert_parallel_plans_end_to_end(profiled_moe_search):
    results, text = profiled_moe_search
    assert "Measured ranking" in text and "not gpu figures" in text.lower()
    records = store.load_records(results)
    assert len(records) == 2
    for record in records:
        assert record["status"] == "ok", record.get("error")
        assert record["device"] == "cpu" and record["world_size"] == 4
        assert record["step_time_s"] > 0 and record["peak_memory_bytes"] > 0
        assert len(record["losses"]) == 3 and record["model_name"] == "tiny-moe-cpu-proxy"
        assert record["moe_dispatcher"] == "alltoall"            # the nemo stack's
        assert "grouped GEMM needs TransformerEngine" in record["run_notes"]
        assert record["losses"][-1] < record["losses"][0]   # the optimizer really stepped
    assert any(record["ep"] > 1 for record in records)
    meta = json.loads((results / store.META_FILE).read_text())
    assert meta["model_name"] == "tiny-moe"


def test_moe_report_ranks_what_ran(profiled_moe_search):
    results, _ = profiled_moe_search
    report = pd.read_csv(results / "profile_report.csv")
    assert sorted(report["measured_rank"]) == [1, 2]
    assert set(report["ep"]) == {r["ep"] for r in store.load_records(results)}
    assert set(report["moe_dispatcher"]) == {"alltoall"}
    text = (results / "profile_report.md").read_text()
    assert "MoE token dispatcher run: alltoall." in text
    assert "## What the runs changed" in text and "grouped GEMM needs TransformerEngine" in text
