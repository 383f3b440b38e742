"""Plan-space enumeration: invariants, narrowing, and rejection counts checked
against a plain Python brute force over the same cartesian product."""

import itertools

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.errors import InputError
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import RECOMPUTE_KINDS, RECOMPUTE_METHODS, Workload
from autoconfig.training.space import (AxisChoices, check_plan, divisors, enumerate_plans,
                              recompute_variants)

A100 = get_gpu("a100-80gb")


def rows(table) -> list[tuple]:
    return [tuple(int(getattr(table, name)[i]) for name in (
        "tp", "pp", "dp", "cp", "vp", "sp", "mbs", "recompute", "recompute_method",
        "recompute_num_layers", "distributed_optimizer")) for i in range(len(table))]


@pytest.fixture(scope="module")
def gpt3_space():
    model = get_model("gpt3", "175b")
    cluster = Cluster(A100, nodes=128, gpus_per_node=8)
    return model, Workload(1536, 2048), cluster, enumerate_plans(model, Workload(1536, 2048),
                                                                 cluster)


def test_every_plan_uses_every_gpu_once(gpt3_space) -> None:
    _, _, cluster, space = gpt3_space
    p = space.plans
    assert len(p) > 1000
    assert np.all(p.tp * p.pp * p.cp * p.dp == cluster.num_gpus)


def test_no_plan_appears_twice(gpt3_space) -> None:
    listed = rows(gpt3_space[3].plans)
    assert len(set(listed)) == len(listed)


def test_rejection_counts_add_up(gpt3_space) -> None:
    space = gpt3_space[3]
    assert space.considered == len(space.plans) + sum(space.rejected.values())
    assert all(count > 0 for count in space.rejected.values())
    assert "gbs not divisible by mbs*dp" in space.rejected


def test_megatron_rules_hold_for_every_plan(gpt3_space) -> None:
    model, workload, _, space = gpt3_space
    p = space.plans
    assert np.all(model.num_heads % p.tp == 0)
    assert np.all(model.num_layers % (p.pp * p.vp) == 0)
    assert np.all(p.tp <= 8)  # the NVLink domain of a DGX A100
    assert np.all(workload.global_batch_size % (p.mbs * p.dp) == 0)
    micro_batches = workload.global_batch_size // (p.mbs * p.dp)
    interleaved = p.vp > 1
    assert np.all(p.pp[interleaved] > 1)
    assert np.all(micro_batches[interleaved] % p.pp[interleaved] == 0)
    assert not np.any(p.sp & (p.tp == 1))
    assert np.all(p.cp == 1)  # seq 2048 < 4096: CP only when asked
    assert not np.any(p.distributed_optimizer & (p.dp == 1))


def test_recompute_variants_cover_every_useful_layer_count() -> None:
    variants = recompute_variants(12, RECOMPUTE_KINDS)
    full = variants[variants[:, 0] == RECOMPUTE_KINDS.index("full")]
    uniform = sorted(full[full[:, 1] == RECOMPUTE_METHODS.index("uniform"), 2])
    block = sorted(full[full[:, 1] == RECOMPUTE_METHODS.index("block"), 2])
    assert uniform == divisors(12) == [1, 2, 3, 4, 6, 12]
    assert block == list(range(1, 12))  # block 12 would equal uniform 1
    assert len(variants) == 2 + 6 + 11


def test_recompute_layers_fit_the_model_chunk(gpt3_space) -> None:
    model, _, _, space = gpt3_space
    p = space.plans
    chunk = model.num_layers // (p.pp * p.vp)
    full = p.recompute == RECOMPUTE_KINDS.index("full")
    assert np.all(p.recompute_num_layers[~full] == 0)
    layers = p.recompute_num_layers[full]
    assert np.all((layers >= 1) & (layers <= chunk[full]))
    uniform = full & (p.recompute_method == RECOMPUTE_METHODS.index("uniform"))
    assert np.all(chunk[uniform] % p.recompute_num_layers[uniform] == 0)


def test_narrowing_flags_are_respected() -> None:
    model = get_model("gpt3", "13b")
    cluster = Cluster(A100, nodes=4, gpus_per_node=8)
    workload = Workload(256, 2048)
    choices = AxisChoices(tp=(2, 4), pp=(2,), vp=(1, 2), mbs=(1, 2),
                          recompute=("full", "selective"), sp="on", distributed_optimizer="off")
    p = enumerate_plans(model, workload, cluster, choices).plans
    assert len(p) > 0
    assert set(p.tp) == {2, 4} and set(p.pp) == {2} and set(p.vp) <= {1, 2}
    assert set(p.mbs) <= {1, 2}
    assert set(p.recompute) == {RECOMPUTE_KINDS.index("full"), RECOMPUTE_KINDS.index("selective")}
    assert p.sp.all() and not p.distributed_optimizer.any()


def test_max_tp_and_cp_narrowing() -> None:
    model = get_model("llama3", "8b")
    cluster = Cluster(get_gpu("h100"), nodes=2, gpus_per_node=8)
    p = enumerate_plans(model, Workload(64, 8192), cluster, AxisChoices(max_tp=2)).plans
    assert set(p.tp) == {1, 2}
    assert set(p.cp) > {1}  # seq 8192: CP tried automatically
    q = enumerate_plans(model, Workload(64, 2048), cluster, AxisChoices(cp=(2,), tp=(4,))).plans
    assert set(q.cp) == {2} and np.all(q.tp * q.pp * 2 * q.dp == 16)


def test_bad_narrowing_is_an_input_error() -> None:
    model = get_model("gpt3", "175b")
    cluster = Cluster(A100, nodes=1, gpus_per_node=8)
    with pytest.raises(InputError, match="tp 128"):
        enumerate_plans(model, Workload(8, 2048), cluster, AxisChoices(tp=(128,)))
    with pytest.raises(InputError, match="tp 5"):
        enumerate_plans(model, Workload(8, 2048), cluster, AxisChoices(tp=(5,)))
    with pytest.raises(InputError, match="pp 97"):  # more stages than layers
        enumerate_plans(model, Workload(8, 2048), cluster, AxisChoices(pp=(97,)))
    with pytest.raises(InputError, match="cp 3"):
        enumerate_plans(model, Workload(8, 2048), cluster, AxisChoices(cp=(3,)))
    with pytest.raises(InputError, match="recompute"):
        AxisChoices(recompute=("sometimes",))


def test_check_plan_names_the_broken_rule() -> None:
    from autoconfig.core.plan import Plan
    model = get_model("gpt3", "175b")
    cluster = Cluster(A100, nodes=128, gpus_per_node=8)
    good = Plan(tp=8, pp=8, dp=16, mbs=1)
    check_plan(model, Workload(1536, 2048), cluster, good)
    with pytest.raises(InputError, match="gbs not divisible"):
        check_plan(model, Workload(1000, 2048), cluster, good)
    with pytest.raises(InputError, match="micro-batches multiple of pp"):
        check_plan(model, Workload(16 * 12, 2048), cluster, Plan(tp=8, pp=8, dp=16, vp=2))


def _brute_force(model, workload, num_gpus, tps, pps, cps, mbss):
    """The same space by plain loops: valid plan tuples and rejections by reason."""
    valid, rejected = set(), {}
    for tp, pp, cp, mbs, sp, do in itertools.product(tps, pps, cps, mbss, (0, 1), (0, 1)):
        if sp and tp == 1:
            continue
        vps = [1] if pp == 1 else divisors(model.num_layers // pp)
        for vp in vps:
            chunk = model.num_layers // (pp * vp)
            variants = [(0, 0, 0), (1, 0, 0)] + [(2, 0, n) for n in divisors(chunk)] + [
                (2, 1, n) for n in range(1, chunk)]
            mp = tp * pp * cp
            if do and num_gpus // mp <= 1:
                continue  # dist-opt is not listed where dp <= 1
            dp = num_gpus // mp
            reason = None
            if num_gpus % mp or mp > num_gpus:
                reason = "dp"
            elif sp and (workload.seq_len // cp) % tp:
                reason = "sp seq"
            elif workload.global_batch_size % (mbs * dp):
                reason = "gbs"
            elif vp > 1 and (workload.global_batch_size // (mbs * dp)) % pp:
                reason = "vp mb"
            if reason:
                rejected[reason] = rejected.get(reason, 0) + len(variants)
                continue
            for kind, method, n in variants:
                valid.add((tp, pp, dp, cp, vp, sp, mbs, kind, method, n, do))
    return valid, rejected


def test_enumeration_matches_brute_force() -> None:
    model = get_model("gpt3", "1.3b")  # 24 layers, 16 heads
    cluster = Cluster(A100, nodes=2, gpus_per_node=8)
    workload = Workload(96, 2048)
    space = enumerate_plans(model, workload, cluster)
    valid, rejected = _brute_force(model, workload, 16, [1, 2, 4, 8],
                                   [p for p in divisors(24) if p <= 16], [1], divisors(96))
    assert set(rows(space.plans)) == valid
    names = {"dp": "dp not integral (GPUs not divisible by tp*pp*cp)",
             "gbs": "gbs not divisible by mbs*dp", "vp mb": "vp needs micro-batches multiple of pp",
             "sp seq": "seq/cp not divisible by tp (sp)"}
    assert space.rejected == {names[k]: v for k, v in rejected.items()}
    assert space.considered == len(valid) + sum(rejected.values())


def test_uneven_splits_balance_embedding_and_output_layer() -> None:
    """Llama 3 405B: 126 layers on 16 stages split 7 + 14 x 8 + 7 (embedding and
    output layer counted as one layer each); a pp that divides the layers keeps
    the even split too; every split adds up to the layers."""
    from autoconfig.core.plan import Plan, stage_layers
    from autoconfig.training.space import stage_splits
    assert stage_splits(126, 16) == [(7, 7)]
    assert (0, 0) in stage_splits(96, 8)
    assert stage_splits(70, 12) == [(5, 5)]
    for layers in (32, 70, 78, 80, 96, 106, 126):
        for pp in range(2, 17):
            for first, last in stage_splits(layers, pp):
                plan = Plan(tp=1, pp=pp, dp=1, first_stage_layers=first, last_stage_layers=last)
                split = stage_layers(layers, plan)
                assert sum(split) == layers and len(split) == pp and min(split) >= 1


def test_search_finds_uneven_plans_for_llama3_405b_on_16k_h100() -> None:
    """Meta's layout (TP 8, CP 1, PP 16 with uneven stages) is among the valid plans."""
    model = get_model("llama3", "405b")
    h100 = get_gpu("h100")
    cluster = Cluster(h100, nodes=2048, gpus_per_node=8)
    space = enumerate_plans(model, Workload(2048, 8192), cluster,
                            AxisChoices(tp=(8,), pp=(16,), cp=(1,), mbs=(1,)))
    plans = [space.plans.plan(i) for i in range(len(space.plans))]
    assert plans and all((p.first_stage_layers, p.last_stage_layers) == (7, 7) for p in plans)
