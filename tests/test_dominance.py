"""A recompute setting that buys no memory is dropped from the ranking, and only
that: plans of other layouts, and settings that trade time for memory, stay."""

import numpy as np
import pandas as pd
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import Plan, PlanTable, Workload
from autoconfig.training.dominance import LAYOUT_FIELDS, dominated
from autoconfig.training.search import search
from autoconfig.units import GIB

NONE = Plan(tp=2, pp=2, dp=2)
SELECTIVE = Plan(tp=2, pp=2, dp=2, recompute="selective")
FULL = Plan(tp=2, pp=2, dp=2, recompute="full")
OTHER_LAYOUT = Plan(tp=4, pp=2, dp=1)


def _dominated(plans, step_s, memory_gib, recompute_s=None):
    table = PlanTable.from_plans(plans)
    recompute_s = np.zeros(len(plans)) if recompute_s is None else np.asarray(recompute_s)
    return dominated(table, np.asarray(step_s), np.asarray(memory_gib) * GIB,
                     recompute_s).tolist()


def test_recompute_that_spares_no_memory_is_dominated() -> None:
    assert _dominated([NONE, SELECTIVE], [1.0, 1.1], [40.0, 40.0], [0.0, 0.1]) == [False, True]


def test_recompute_that_spares_memory_stays() -> None:
    assert _dominated([NONE, SELECTIVE, FULL], [1.0, 1.1, 1.3], [60.0, 50.0, 30.0],
                      [0.0, 0.1, 0.3]) == [False, False, False]


def test_a_slower_and_larger_setting_is_dominated_whatever_its_kind() -> None:
    # Full recompute that came out larger than none (a wider micro-batch is not
    # involved: same layout) is never the better choice.
    assert _dominated([NONE, FULL], [1.0, 1.2], [40.0, 41.0], [0.0, 0.2]) == [False, True]


def test_of_exact_twins_the_one_recomputing_less_survives() -> None:
    # Order of the input does not decide: the plan with less recompute work is kept.
    assert _dominated([SELECTIVE, NONE], [1.0, 1.0], [40.0, 40.0], [0.05, 0.0]) == [True, False]
    assert _dominated([FULL, SELECTIVE], [1.0, 1.0], [40.0, 40.0], [0.0, 0.0]) == [True, False]


def test_of_twins_full_recompute_of_every_layer_goes_before_one_layer() -> None:
    every = Plan(tp=2, pp=2, dp=2, recompute="full", recompute_num_layers=0)
    one = Plan(tp=2, pp=2, dp=2, recompute="full", recompute_method="block",
               recompute_num_layers=1)
    assert _dominated([every, one], [1.0, 1.0], [40.0, 40.0]) == [True, False]


def test_other_layouts_are_never_compared() -> None:
    assert _dominated([OTHER_LAYOUT, SELECTIVE], [1.0, 2.0], [10.0, 70.0]) == [False, False]


def test_one_plan_or_none() -> None:
    assert _dominated([NONE], [1.0], [1.0]) == [False]
    assert _dominated([], [], []) == []


@pytest.fixture(scope="module")
def llama_result():
    return search(get_model("llama3", "70b"), Workload(128, 8192),
                  Cluster(get_gpu("h100-80gb"), nodes=8, gpus_per_node=8))


def test_search_keeps_no_dominated_plan(llama_result) -> None:
    t = llama_result.table
    assert llama_result.dominated > 0
    layout = pd.Series(list(zip(*(t[f] for f in LAYOUT_FIELDS))), index=t.index)
    for _, rows in t.groupby(layout):
        step = rows.step_time_s.to_numpy()
        mem = rows.memory_gib.to_numpy()
        for i in range(len(rows)):
            others = np.arange(len(rows)) != i
            assert not np.any(others & (step <= step[i]) & (mem <= mem[i]))


def test_search_counts_add_up(llama_result) -> None:
    r = llama_result
    assert r.considered == r.feasible + sum(r.rejected.values()) + r.dominated


def _estimate(recompute: str, fused: bool = True) -> dict:
    from dataclasses import replace

    from autoconfig.training.estimate import estimate_plan
    from autoconfig.training.stack import load_stack
    software = replace(load_stack("megatron-lm").features, flash_attention=fused)
    plan = Plan(tp=8, pp=8, dp=16, sp=True, recompute=recompute, distributed_optimizer=True)
    return estimate_plan(get_model("gpt3", "175b"), Workload(1536, 2048),
                         Cluster(get_gpu("a100-80gb"), nodes=128, gpus_per_node=8), plan,
                         software, "megatron-lm")


def test_estimate_names_the_recompute_that_spares_nothing() -> None:
    given = _estimate("selective")
    bare = given["without_recompute"]
    assert bare["memory_gib"] <= given["memory_gib"] + 1e-6
    assert bare["step_time_s"] < given["step_time_s"]


def test_estimate_is_silent_where_recompute_spares_memory_or_is_off() -> None:
    # Unfused attention stores the scores selective recompute spares; full
    # recompute spares the layers' activations; no recompute has nothing to drop.
    assert "without_recompute" not in _estimate("selective", fused=False)
    assert "without_recompute" not in _estimate("full")
    assert "without_recompute" not in _estimate("none")
