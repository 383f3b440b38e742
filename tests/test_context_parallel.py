"""Context-parallel schemes (--cp-comm-type): the all-to-all group sizes and head
rules Transformer Engine imposes, what each scheme costs, and the CLI."""

import dataclasses

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import cluster_from_gpus
from autoconfig.core.plan import Plan, PlanTable, Workload
from autoconfig.errors import InputError
from autoconfig.training.context_parallel import a2a_group_size, heads_divide
from autoconfig.training.space import check_plan
from autoconfig.training.stack import load_stack, override_flags, with_overrides
from autoconfig.training.step_time import load_constants, step_time
from tests.cli_runner import run_cli

LLAMA3_8B = get_model("llama3-8b")          # 32 query heads, 8 key-value heads
H100 = get_gpu("h100-80gb")
LONG = Workload(16, 131072)


def _cp_comm(comm: str, gpus: int, tp: int, cp: int, recompute="none") -> float:
    plan = Plan(tp=tp, pp=1, dp=gpus // (tp * cp), cp=cp, sp=tp > 1, mbs=1,
                recompute=recompute, distributed_optimizer=True,
                **({"recompute_method": "uniform", "recompute_num_layers": 1}
                   if recompute == "full" else {}))
    sw = with_overrides(load_stack("megatron-lm").features, cp_comm_type=comm)
    perf = step_time(LLAMA3_8B, LONG, PlanTable.from_plans([plan]),
                     cluster_from_gpus(H100, gpus, 8), software=sw)
    return float(perf.cp_comm_s[0])


def test_a2a_groups_follow_the_heads_and_the_node():
    """a2a groups all cp ranks; a2a+p2p the largest divisor of cp that fits the
    NVLink domain beside TP and divides the heads a TP rank holds; p2p none."""
    assert int(a2a_group_size("a2a", LLAMA3_8B, 1, 16, 8)) == 16
    assert int(a2a_group_size("p2p", LLAMA3_8B, 1, 16, 8)) == 1
    assert int(a2a_group_size("a2a+p2p", LLAMA3_8B, 1, 16, 8)) == 8     # one node of 8
    assert int(a2a_group_size("a2a+p2p", LLAMA3_8B, 2, 8, 8)) == 4      # 2 x 4 in a node
    assert int(a2a_group_size("a2a+p2p", LLAMA3_8B, 8, 4, 8)) == 1      # TP fills the node
    # 8 key-value heads: split over 8, not 16; at TP 2 each rank holds 4
    assert bool(heads_divide(LLAMA3_8B, 1, 8)) and not bool(heads_divide(LLAMA3_8B, 1, 16))
    assert not bool(heads_divide(LLAMA3_8B, 2, 8))
    vectorised = a2a_group_size("a2a+p2p", LLAMA3_8B, np.array([1, 2, 8]),
                                np.array([16, 8, 4]), 8)
    assert list(vectorised) == [8, 4, 1]


def test_a2a_plan_the_heads_cannot_split_is_refused_with_the_fix():
    cluster = cluster_from_gpus(H100, 16, 8)
    plan = Plan(tp=1, pp=1, dp=1, cp=16, mbs=1)
    check_plan(LLAMA3_8B, LONG, cluster, plan)                   # the ring runs it
    check_plan(LLAMA3_8B, LONG, cluster, plan, "a2a+p2p")        # a group of 8 splits them
    with pytest.raises(InputError, match="cp a2a group does not divide the heads.*"
                                         "--cp-comm-type p2p"):
        check_plan(LLAMA3_8B, LONG, cluster, plan, "a2a")


def test_a2a_exchanges_are_exposed_and_priced_from_their_bytes():
    """Inside one node the all-to-all costs what its bytes take over NVLink, twice a
    layer (forward, backward) and again for a recomputed layer, with no ring step
    to merge; a2a+p2p whose group holds all cp ranks is the same scheme."""
    c = load_constants()
    cp, layers = 8, LLAMA3_8B.num_layers
    tokens = LONG.seq_len / cp
    m = LLAMA3_8B
    per_token = 2 * (m.q_width + m.num_kv_heads * (m.head_dim + m.value_head_dim)
                     + m.num_heads * m.value_head_dim)
    nv = H100.nvlink_bandwidth_gb_per_s * 1e9 * c.comm_bandwidth_efficiency
    exchange = tokens * per_token * (cp - 1) / cp / nv + 2 * c.comm_latency_s
    micro_batches = LONG.global_batch_size          # dp 1, mbs 1
    assert _cp_comm("a2a", 8, 1, cp) == pytest.approx(micro_batches * 2 * layers * exchange)
    assert _cp_comm("a2a", 8, 1, cp, "full") == pytest.approx(
        micro_batches * 3 * layers * exchange)
    assert _cp_comm("a2a+p2p", 8, 1, cp) == pytest.approx(_cp_comm("a2a", 8, 1, cp))


def test_hierarchical_scheme_keeps_the_all_to_all_on_nvlink():
    """CP 16 over two nodes: a2a sends half its bytes over the network and hides
    none; a2a+p2p exchanges inside each node and rings once across, behind the
    attention; so it exposes less."""
    a2a, hierarchical = _cp_comm("a2a", 16, 1, 16), _cp_comm("a2a+p2p", 16, 1, 16)
    assert 0 < hierarchical < a2a


def test_cp_comm_type_is_a_stack_override_that_round_trips():
    stack = load_stack("nemo").features
    chosen = with_overrides(stack, cp_comm_type="a2a+p2p")
    assert chosen.cp_comm_type == "a2a+p2p" and stack.cp_comm_type == "p2p"
    assert override_flags(stack, chosen) == ["--cp-comm-type", "a2a+p2p"]
    with pytest.raises(InputError, match="invalid --cp-comm-type 'allgather'"):
        with_overrides(stack, cp_comm_type="allgather")
    assert dataclasses.replace(chosen, cp_comm_type="p2p") == stack


def test_estimate_takes_the_scheme_and_refuses_an_unsplittable_plan(capsys):
    common = ["estimate", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "16",
              "--tp", "1", "--pp", "1", "--cp", "16", "--mbs", "1", "--gbs", "16",
              "--seq-len", "131072", "--recompute", "full"]
    code, out, _ = run_cli([*common, "--cp-comm-type", "a2a+p2p"], capsys)
    assert code == 0 and "cp_comm" in out
    code, _, err = run_cli([*common, "--cp-comm-type", "a2a"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "cp a2a group does not divide the heads" in err and "cp 16" in err


def test_profiling_spec_carries_the_scheme_and_says_what_ran_on_cpu():
    """The profiling worker is asked the stack's scheme with the group the
    prediction sized; only Transformer Engine's attention (GPUs) has the schemes,
    so a CPU run records that it ran megatron-core's own ring instead."""
    from autoconfig.profiling.spec import ProfileSpec
    from autoconfig.profiling.sweep import ProfileOptions, _spec
    from autoconfig.profiling.worker import _cp_comm_type, _hierarchical_cp_sizes, run_choices
    plan = Plan(tp=2, pp=1, dp=1, cp=8, sp=True, mbs=1)
    sw = with_overrides(load_stack("megatron-lm").features, cp_comm_type="a2a+p2p")
    spec = _spec(LLAMA3_8B, Workload(16, 8192), plan, ProfileOptions(profile=True),
                 sw, domain_gpus=8)
    assert (spec.cp_comm_type, spec.cp_a2a_size) == ("a2a+p2p", 4)
    assert ProfileSpec.from_json(spec.to_json()) == spec
    on_cpu = dataclasses.replace(spec, device="cpu")
    assert _cp_comm_type(on_cpu) is None and _hierarchical_cp_sizes(on_cpu) is None
    _, notes = run_choices(on_cpu)
    assert any("a2a+p2p needs TransformerEngine attention" in n for n in notes)
    with pytest.raises(InputError, match="invalid cp a2a size 3"):
        dataclasses.replace(spec, cp_a2a_size=3)
