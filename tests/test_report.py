"""Golden report files for one small search (tests/golden/report/).

On a mismatch the test prints a unified diff. After an intended change to the
report, or to the memory/step-time models it shows, regenerate with:

    AUTOCONFIG_UPDATE_GOLDEN=1 python -m pytest -q tests/test_report.py
"""

import difflib
import os
from pathlib import Path

import pytest
import yaml

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import Workload
from autoconfig.launch.files import (BRIDGE_NAME, BRIDGE_SBATCH_NAME, MEGATRON_NAME, NEMO_NAME,
                                     SBATCH_NAME)
from autoconfig.launch.megatron_lm import megatron_args
from autoconfig.launch.spec import launch_spec
from autoconfig.reports.search_report import (BEST_JSON_NAME, BEST_NAME, CSV_NAME, MARKDOWN_NAME,
                                              write_report)
from autoconfig.training.search import search
from autoconfig.training.space import AxisChoices

GOLDEN = Path(__file__).parent / "golden" / "report"
FILES = (CSV_NAME, MARKDOWN_NAME, BEST_NAME, BEST_JSON_NAME, MEGATRON_NAME, SBATCH_NAME,
         BRIDGE_NAME, BRIDGE_SBATCH_NAME, NEMO_NAME)


@pytest.fixture(scope="module")
def small_search():
    # GPT-3 1.3B on 2 DGX A100 nodes, narrowed so the CSV stays short.
    return search(get_model("gpt3", "1.3b"), Workload(96, 2048),
                  Cluster(get_gpu("a100-80gb"), nodes=2, gpus_per_node=8),
                  AxisChoices(tp=(1, 2), pp=(1, 2, 3), mbs=(1, 2, 4, 32),
                              recompute=("none", "selective")))


@pytest.fixture(scope="module")
def written(small_search, tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    return write_report(small_search, out, top=5)


@pytest.mark.parametrize("name", FILES)
def test_report_file_matches_golden(written, name: str) -> None:
    actual = (next(iter(written.values())).parent / name).read_text()
    golden = GOLDEN / name
    if os.environ.get("AUTOCONFIG_UPDATE_GOLDEN") == "1":
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(actual)
        return
    expected = golden.read_text() if golden.exists() else ""
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"golden/{name}", f"actual/{name}"))
        print(diff)
        pytest.fail(f"{name} differs from tests/golden/report/{name} (diff above); if the "
                    "change is intended, rerun with AUTOCONFIG_UPDATE_GOLDEN=1")


def test_every_file_written_and_no_temporaries_left(written) -> None:
    folder = next(iter(written.values())).parent
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)


def test_best_yaml_is_the_winner(written, small_search) -> None:
    best = yaml.safe_load(written["best"].read_text())
    from autoconfig.core.plan import Plan
    assert Plan(**best["plan"]) == small_search.best          # fields that do not apply left out
    if small_search.best.recompute != "full":
        assert "recompute_method" not in best["plan"] and "recompute_num_layers" not in best["plan"]
    assert best["cluster"]["gpus"] == 16
    row = small_search.table.iloc[0]
    assert best["predicted"]["step_time_s"] == pytest.approx(row.step_time_s, rel=1e-3)


def test_megatron_flags_follow_the_plan() -> None:
    from autoconfig.core.plan import Plan
    model = get_model("llama3", "8b")
    plan = Plan(tp=2, pp=4, dp=2, cp=2, vp=2, sp=True, mbs=1, recompute="full",
                recompute_method="block", recompute_num_layers=3, distributed_optimizer=True)
    cluster = Cluster(get_gpu("h100-80gb"), nodes=2, gpus_per_node=8)

    def args_of(plan):
        return " ".join(megatron_args(launch_spec(model, Workload(64, 8192), plan, cluster)))
    args = args_of(plan)
    for expected in ("--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 4",
                     "--num-virtual-stages-per-pipeline-rank 2", "--context-parallel-size 2",
                     "--sequence-parallel", "--micro-batch-size 1", "--global-batch-size 64",
                     "--recompute-granularity full", "--recompute-method block",
                     "--recompute-num-layers 3", "--use-distributed-optimizer",
                     "--group-query-attention", "--num-query-groups 8", "--swiglu"):
        assert expected in args
    plain = args_of(Plan(tp=1, pp=1, dp=16))
    assert "--sequence-parallel" not in plain and "--recompute" not in plain
    assert "--num-virtual-stages-per-pipeline-rank" not in plain
