"""End-to-end MoE profiling search on CPU: a search of the tiny-moe model on 4
(CPU) ranks whose selected plans, expert-parallel ones among them, run real
megatron-core steps with the stack's token dispatcher.

Driven through the library calls ``autoconfig search --profile`` makes (search,
ranked_from_search, run_profiling with the search's software features): at this
commit the search command's stack options lack the MoE overrides
(``pop_software`` raises KeyError 'moe_a2a_overlap') and there is no ``--ep``.
"""

import json

import pandas as pd
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import Workload
from autoconfig.profiling import store
from autoconfig.profiling.launch import LaunchOptions
from autoconfig.profiling.sweep import ProfileOptions, ranked_from_search, run_profiling
from autoconfig.training.search import search
from autoconfig.training.space import AxisChoices

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def profiled_moe_search(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    out = tmp_path_factory.mktemp("tiny-moe-search")
    cluster = Cluster(gpu=get_gpu("h100-80gb"), nodes=1, gpus_per_node=4)
    # mbs 1 and gbs 8 keep each job to seconds; the nemo stack runs the alltoall
    # dispatcher and asks for grouped GEMM (which needs CUDA: noted in the record).
    result = search(get_model("tiny-moe"), Workload(8, 128), cluster, AxisChoices(mbs=(1,)),
                    stack="nemo")
    options = ProfileOptions(profile=True, top_k=2, max_steps=2, warmup_steps=1,
                             launch=LaunchOptions(executor="local", device="cpu",
                                                  time_limit_min=5, max_parallel=1))
    lines = []
    results = run_profiling(ranked_from_search(result), result.model, result.workload,
                            result.cluster, options, out,
                            echo=lambda text="", err=False: lines.append(str(text)),
                            software=result.software)
    return results, "\n".join(lines)


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
