"""Step-time model: formulas with plain numbers, invariants, vectorised == per-row."""

import dataclasses

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.comm import hierarchical_allreduce_s, members_in_domain, ring_allreduce_s
from autoconfig.core.hardware import cluster_from_gpus
from autoconfig.core.model import attention_core_flops_per_token, model_flops_per_token
from autoconfig.training.step_time import (PerfConstants, SoftwareFeatures, gemm_time_s, load_constants,
                             step_time)
from autoconfig.core.plan import Plan, PlanTable, Workload

GPT3 = get_model("gpt3", "175b")
A100 = get_gpu("a100-80gb")
H100 = get_gpu("h100-80gb")
WORKLOAD = Workload(global_batch_size=1536, seq_len=2048)
CLUSTER = cluster_from_gpus(A100, 1024, 8)


def one(plan: Plan, workload=WORKLOAD, cluster=CLUSTER, model=GPT3, **kw):
    perf = step_time(model, workload, PlanTable.from_plans([plan]), cluster, **kw)
    return {f.name: float(getattr(perf, f.name)[0]) for f in dataclasses.fields(perf)}


def plan(**kw) -> Plan:
    base = dict(tp=8, pp=8, dp=16, mbs=1, recompute="selective", sp=True)
    base.update(kw)
    return Plan(**base)


def test_ring_allreduce_cost_plain_numbers():
    # 8 ranks, 1 GB, 100 GB/s: 2 * 7/8 * 1e9 / 1e11 = 17.5 ms
    assert ring_allreduce_s(1e9, 8, 1e11) == pytest.approx(0.0175)
    assert ring_allreduce_s(1e9, 1, 1e11) == 0.0
    # latency: 2 (n-1) hops
    assert ring_allreduce_s(0.0, 4, 1e11, latency_s=1e-5) == pytest.approx(6e-5)


def test_hierarchical_allreduce_reduces_to_flat_rings():
    flat_nv = ring_allreduce_s(1e9, 8, 3e11)
    assert hierarchical_allreduce_s(1e9, 8, 8, 3e11, 2.5e10) == pytest.approx(flat_nv)
    flat_ib = ring_allreduce_s(1e9, 16, 2.5e10)
    assert hierarchical_allreduce_s(1e9, 16, 1, 3e11, 2.5e10) == pytest.approx(flat_ib)
    # 16 ranks, 8 per node: NVLink ring of 8 plus an IB ring of 2 on 1/8 of the bytes
    expected = ring_allreduce_s(1e9, 8, 3e11) + ring_allreduce_s(1e9 / 8, 2, 2.5e10)
    assert hierarchical_allreduce_s(1e9, 16, 8, 3e11, 2.5e10) == pytest.approx(expected)


def test_training_allreduce_latency_follows_nccl_model_by_link():
    """A training all-reduce's latency is NCCL's: a base per collective plus a
    step latency per ring step, NVLink's inside a domain and the network's
    across; an empty message costs exactly that."""
    from autoconfig.training.step_time import allreduce_s
    c = load_constants()
    base, nv_step, net_step = (c.collective_base_latency_s, c.nvlink_step_latency_s,
                               c.comm_latency_s)
    assert nv_step < net_step
    # 8 ranks in one domain: 14 NVLink steps
    assert allreduce_s(c, 0.0, 8, 8, 3e11, 2.5e10) == pytest.approx(base + 14 * nv_step)
    # 16 ranks, 8 a node: 14 NVLink steps and 2 network steps, one base
    assert allreduce_s(c, 0.0, 16, 8, 3e11, 2.5e10) == pytest.approx(
        base + 14 * nv_step + 2 * net_step)
    assert allreduce_s(c, 0.0, 1, 1, 3e11, 2.5e10) == 0.0
    # the bytes still cost what the rings move
    assert allreduce_s(c, 1e9, 8, 8, 3e11, 2.5e10) == pytest.approx(
        ring_allreduce_s(1e9, 8, 3e11) + base + 14 * nv_step)
    # TP 8 now costs less than twice TP 4's latency, as a ring of 14 steps against 6
    tp4, tp8 = (allreduce_s(c, 0.0, n, n, 3e11, 2.5e10) for n in (4, 8))
    assert tp8 / tp4 < 14 / 6


def test_training_gather_latency_is_one_ring_through_every_rank():
    """An all-gather or reduce-scatter over nodes is NCCL's ring through all n
    ranks: n - 1 steps, nNodes - 1 of them over the network, one base; its bytes
    are half an all-reduce's."""
    from autoconfig.training.step_time import allreduce_s, gather_s
    c = load_constants()
    base, nv_step, net_step = (c.collective_base_latency_s, c.nvlink_step_latency_s,
                               c.comm_latency_s)
    # 512 ranks on 64 nodes of 8: 448 NVLink steps and 63 network steps
    assert gather_s(c, 0.0, 512, 8, 3e11, 2.5e10) == pytest.approx(
        base + 448 * nv_step + 63 * net_step)
    # inside one domain: 7 NVLink steps
    assert gather_s(c, 0.0, 8, 8, 3e11, 2.5e10) == pytest.approx(base + 7 * nv_step)
    assert gather_s(c, 1e9, 1, 1, 3e11, 2.5e10) == 0.0
    bytes_only = 0.5 * (ring_allreduce_s(1e9, 8, 3e11) + ring_allreduce_s(1e9 / 8, 64, 2.5e10))
    assert gather_s(c, 1e9, 512, 8, 3e11, 2.5e10) == pytest.approx(
        bytes_only + base + 448 * nv_step + 63 * net_step)
    # the ring's latency grows with the ranks, not only the nodes: at 512 ranks a
    # gather's latency exceeds half a hierarchical all-reduce's by the 441 extra NVLink steps
    extra = gather_s(c, 0.0, 512, 8, 3e11, 2.5e10) - 0.5 * allreduce_s(c, 0.0, 512, 8, 3e11, 2.5e10)
    assert extra == pytest.approx(0.5 * base + 441 * nv_step)


def test_members_in_domain_follow_megatron_rank_order():
    assert members_in_domain(16, 1, 8) == 8     # tp-like inner group
    assert members_in_domain(16, 8, 8) == 1     # dp group over tp=8: one per node
    assert members_in_domain(16, 2, 8) == 4
    assert members_in_domain(2, 1, 8) == 2


def test_gemm_roofline_penalty():
    # r = 100 flop/elem, factor 1, M=N=K=100: penalty 1 + 100 * 3/100 = 4
    assert gemm_time_s(1e12, 100, 100, 100, 1e12, 0.5, 100, 1.0) == pytest.approx(8.0)
    assert gemm_time_s(1e12, np.inf, np.inf, np.inf, 1e12, 0.5, 100, 1.0) == pytest.approx(2.0)


def test_bubble_is_p_minus_1_over_v_m_of_pipeline_time():
    """(p-1)/(v m) of the last stage's busy time, less its output layer and loss: the
    fill and drain slots are the other stages' micro-batches, which have no logits."""
    from autoconfig.training.step_time import _forward_times
    for vp in (1, 2, 3):
        p = plan(vp=vp)
        perf = one(p)
        micro = WORKLOAD.global_batch_size / 16
        busy = perf["compute_s"] + perf["recompute_s"] + perf["tp_comm_s"] + perf["cp_comm_s"]
        times = _forward_times(GPT3, WORKLOAD, PlanTable.from_plans([p]), A100,
                               load_constants(), SoftwareFeatures())
        head = float(3.0 * times["logits"][0] + times["loss"][0])
        expected = (8 - 1) / (vp * micro) * (busy - micro * head)
        assert perf["pp_bubble_s"] == pytest.approx(expected)
        assert perf["pp_bubble_s"] / busy < (8 - 1) / (vp * micro)


def test_more_microbatches_smaller_bubble_fraction():
    fractions = []
    for gbs in (256, 512, 1536, 3072):
        perf = one(plan(), workload=Workload(global_batch_size=gbs, seq_len=2048))
        fractions.append(perf["pp_bubble_s"] / perf["step_time_s"])
    assert all(a > b for a, b in zip(fractions, fractions[1:]))


def test_no_pipeline_no_bubble_no_p2p():
    perf = one(plan(pp=1, dp=128))
    assert perf["pp_bubble_s"] == 0.0 and perf["pp_p2p_s"] == 0.0


def test_rates_are_consistent():
    perf = one(plan())
    gpus = 1024
    assert perf["tokens_per_s_per_gpu"] * gpus * perf["step_time_s"] == pytest.approx(
        WORKLOAD.tokens_per_step)
    model_tflops = perf["tokens_per_s_per_gpu"] * model_flops_per_token(GPT3, 2048) / 1e12
    assert perf["model_tflops_per_gpu"] == pytest.approx(model_tflops)
    assert perf["mfu"] == pytest.approx(perf["model_tflops_per_gpu"] / A100.peak_bf16_tflops)
    parts = ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "pp_bubble_s", "pp_p2p_s",
             "dp_comm_s", "optimizer_s")
    assert sum(perf[p] for p in parts) == pytest.approx(perf["step_time_s"])
    assert 0.2 < perf["mfu"] < 0.7


def test_recompute_full_ge_selective_ge_none():
    times = {rc: one(plan(recompute=rc))["step_time_s"] for rc in ("none", "selective", "full")}
    assert times["full"] > times["selective"] > times["none"]
    # also without flash attention, where selective recomputes the s^2 softmax work
    legacy = SoftwareFeatures(flash_attention=False)
    times = {rc: one(plan(recompute=rc), software=legacy)["step_time_s"]
             for rc in ("none", "selective", "full")}
    assert times["full"] > times["selective"] > times["none"]


def test_block_recompute_of_fewer_layers_is_cheaper():
    all_layers = one(plan(recompute="full"))["recompute_s"]
    some = one(plan(recompute="full", recompute_method="block", recompute_num_layers=4))
    assert 0 < some["recompute_s"] < all_layers
    assert some["recompute_s"] == pytest.approx(all_layers * 4 / 12)


def test_slower_gpu_slower_step():
    a100 = one(plan())["step_time_s"]
    h100 = one(plan(), cluster=cluster_from_gpus(H100, 1024, 8))["step_time_s"]
    assert h100 < a100


def test_fp8_speeds_up_gemms_only_on_fp8_gpus():
    h100 = cluster_from_gpus(H100, 1024, 8)
    bf16 = one(plan(), cluster=h100)
    fp8 = one(plan(), workload=Workload(1536, 2048, "fp8"), cluster=h100)
    assert fp8["compute_s"] < bf16["compute_s"]
    assert fp8["compute_s"] > bf16["compute_s"] / 2.0 - 1e-9  # attention and elementwise stay bf16
    assert fp8["mfu"] == pytest.approx(fp8["model_tflops_per_gpu"] / H100.peak_fp8_tflops)


def test_tp_across_nodes_costs_more_than_inside():
    inside = one(plan(tp=8, pp=8, dp=16))["tp_comm_s"]
    across = one(plan(tp=16, pp=4, dp=16))["tp_comm_s"]
    assert across > inside


def test_overlapped_dp_reduce_is_cheaper_and_dist_opt_adds_gather():
    p = plan(pp=1, dp=128, tp=8, recompute="full")
    exposed = one(p, software=SoftwareFeatures(overlap_grad_reduce=False))["dp_comm_s"]
    hidden = one(p, software=SoftwareFeatures(overlap_grad_reduce=True))["dp_comm_s"]
    assert exposed > 0 and hidden < exposed
    fp32 = one(p, software=SoftwareFeatures(overlap_grad_reduce=False, grad_reduce_bytes=4))
    with_opt = one(dataclasses.replace(p, distributed_optimizer=True),
                   software=SoftwareFeatures(overlap_grad_reduce=False, grad_reduce_bytes=4))
    # reduce-scatter of fp32 grads + all-gather of bf16 params = (4 + 2) / 2 / 4 of the all-reduce
    assert with_opt["dp_comm_s"] == pytest.approx(fp32["dp_comm_s"] * 0.75, rel=1e-3)


def test_context_parallel_comm_only_when_cp_gt_1():
    model = get_model("llama3-70b") if _has("llama3-70b") else GPT3
    wl = Workload(global_batch_size=64, seq_len=32768)
    cluster = cluster_from_gpus(H100, 256, 8)
    no_cp = one(Plan(tp=8, pp=4, dp=8, cp=1, sp=True), workload=wl, cluster=cluster, model=model)
    assert no_cp["cp_comm_s"] == 0.0
    with_cp = one(Plan(tp=8, pp=4, dp=2, cp=4, sp=True), workload=wl, cluster=cluster, model=model)
    assert with_cp["cp_comm_s"] >= 0.0
    assert with_cp["step_time_s"] > 0


def _has(name: str) -> bool:
    try:
        get_model(name)
        return True
    except Exception:
        return False


def test_vectorised_rows_are_independent_of_their_neighbours():
    """A plan's figures must not depend on the other rows of the table: the
    table in one order equals the table reversed (row for row, read back by
    plan), the plans really differ (a constant result would fail), and each
    row holds its own tokens/s = tokens per step / step time / GPUs."""
    plans = [plan(), plan(vp=2), plan(tp=4, pp=16, dp=16, sp=False, recompute="full"),
             plan(tp=8, pp=1, dp=128, mbs=2, recompute="none", distributed_optimizer=True),
             plan(tp=2, pp=4, dp=64, cp=2, recompute="full", recompute_method="block",
                  recompute_num_layers=3)]
    forward = step_time(GPT3, WORKLOAD, PlanTable.from_plans(plans), CLUSTER)
    backward = step_time(GPT3, WORKLOAD, PlanTable.from_plans(plans[::-1]), CLUSTER)
    n = len(plans)
    steps = [float(forward.step_time_s[i]) for i in range(n)]
    assert len({round(s, 9) for s in steps}) == n, steps      # five layouts, five step times
    for f in dataclasses.fields(forward):
        ours, theirs = getattr(forward, f.name), getattr(backward, f.name)
        for i in range(n):
            assert ours[i] == pytest.approx(theirs[n - 1 - i]), (i, f.name)
    tokens = WORKLOAD.global_batch_size * WORKLOAD.seq_len
    for i in range(n):
        assert forward.tokens_per_s_per_gpu[i] * CLUSTER.num_gpus * steps[i] == \
            pytest.approx(tokens, rel=1e-9)


def test_constants_loaded_with_sources_and_overridable():
    constants = load_constants()
    assert set(constants.gemm_efficiency_max) >= {"ampere", "hopper", "blackwell"}
    assert 0 < constants.efficiency_max(A100) <= 1
    faster = dataclasses.replace(constants, gemm_efficiency_max={
        k: min(1.0, v * 1.2) for k, v in constants.gemm_efficiency_max.items()})
    assert one(plan(), constants=faster)["compute_s"] < one(plan())["compute_s"]
    assert isinstance(constants, PerfConstants)


def test_scatter_gather_divides_pipeline_sends_by_tp():
    p = plan(sp=False, recompute="full")
    whole = one(p, software=SoftwareFeatures(p2p_scatter_gather=False))["pp_p2p_s"]
    split = one(p, software=SoftwareFeatures(p2p_scatter_gather=True))["pp_p2p_s"]
    assert split < whole / 4  # bytes / 8, plus the same per-send latency


def test_interleaved_pipeline_sends_hide_behind_compute_only_when_overlapped():
    """Megatron overlaps the interleaved schedule's sends (overlap_p2p_comm): each
    transfer hides behind a chunk's compute. Without VP (1F1B) or with the overlap
    off every send/receive waits on the compute stream; off, VP multiplies them."""
    on, off = SoftwareFeatures(overlap_p2p_comm=True), SoftwareFeatures(overlap_p2p_comm=False)
    interleaved = plan(vp=2)
    hidden = one(interleaved, software=on)["pp_p2p_s"]
    blocking = one(interleaved, software=off)["pp_p2p_s"]
    assert 0 < hidden < blocking / 20   # only the fill and drain transfers remain
    assert one(plan(), software=on)["pp_p2p_s"] == one(plan(), software=off)["pp_p2p_s"]
    assert blocking == pytest.approx(2 * one(plan(), software=off)["pp_p2p_s"])
    assert one(interleaved, software=on)["step_time_s"] < one(interleaved, software=off)[
        "step_time_s"]


def test_the_slowest_stage_of_an_uneven_split_sets_the_step():
    """GPT-3 175B (96 layers) on 16 stages: 6 each (the last also runs the output
    layer, about a third of a layer here), or 7 + 14 x 6 + 5, or 5 + 14 x 6 + 7.
    The slowest stage sets the steady state: 6 + output < 7 < 7 + output."""
    even = one(plan(pp=16, dp=8))
    light = one(plan(pp=16, dp=8, first_stage_layers=7, last_stage_layers=5))
    heavy = one(plan(pp=16, dp=8, first_stage_layers=5, last_stage_layers=7))
    assert even["step_time_s"] < light["step_time_s"] < heavy["step_time_s"]
    assert even["compute_s"] < light["compute_s"] < heavy["compute_s"]


def test_perf_yaml_without_source_is_a_catalog_error(tmp_path):
    from autoconfig.errors import CatalogError
    bad = tmp_path / "perf.yaml"
    bad.write_text("source: x\ngemm_efficiency_max:\n  ampere: {value: 0.6}\n")
    with pytest.raises(CatalogError, match="no source"):
        load_constants(bad)


def test_framework_layer_overhead_is_per_layer_per_microbatch():
    """A fixed cost c per layer per micro-batch adds (m + (pp-1)/vp) * (L/pp) * c:
    every micro-batch on the slowest stage plus the bubble's pp-1 micro-batch slots."""
    constants = dataclasses.replace(load_constants(), layer_overhead_s={"megatron-deepspeed": 0.01})
    p = plan(pp=8, dp=16, mbs=1)
    core = one(p, constants=constants)["step_time_s"]
    ds = one(p, constants=constants,
             software=SoftwareFeatures(framework="megatron-deepspeed"))["step_time_s"]
    micro = WORKLOAD.global_batch_size / (p.mbs * p.dp)
    layers = GPT3.num_layers / p.pp
    assert ds - core == pytest.approx((micro + (p.pp - 1)) * layers * 0.01)
    # It is what makes small micro-batches slow: MBS 1 pays it four times as often as MBS 4.
    small = one(plan(pp=8, dp=16, mbs=1), constants=constants,
                software=SoftwareFeatures(framework="megatron-deepspeed"))["compute_s"]
    small_core = one(plan(pp=8, dp=16, mbs=1), constants=constants)["compute_s"]
    big = one(plan(pp=8, dp=16, mbs=4), constants=constants,
              software=SoftwareFeatures(framework="megatron-deepspeed"))["compute_s"]
    big_core = one(plan(pp=8, dp=16, mbs=4), constants=constants)["compute_s"]
    assert small - small_core == pytest.approx(4 * (big - big_core))


def test_shipped_layer_overhead_only_for_non_megatron_core_frameworks():
    constants = load_constants()
    assert constants.layer_overhead_s.get("megatron-core", 0.0) == 0.0
    assert constants.layer_overhead_s["megatron-deepspeed"] > 0.0
    assert constants.layer_overhead_s["pytorch-fsdp"] > 0.0
    unknown = one(plan(), software=SoftwareFeatures(framework="other"))["step_time_s"]
    assert unknown == pytest.approx(one(plan())["step_time_s"])


def test_unfused_gradient_accumulation_streams_the_stage_gradients_every_microbatch():
    """Without gradient-accumulation fusion each micro-batch reads the 16-bit
    gradient and reads and writes the accumulator: (2 + 2 x 4) bytes per
    parameter with fp32 accumulation, 8 more with DeepSpeed's cast copy, over
    the parameters of the slowest stage at HBM speed; paid m + (pp - 1) times
    (the bubble's slots included) when the stages are even."""
    from autoconfig.core.model import layer_params
    c = load_constants()
    p = plan(pp=8, dp=16, mbs=1)
    micro = WORKLOAD.global_batch_size / (p.mbs * p.dp)
    hbm = A100.hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency
    fused = one(p)
    middle = GPT3.num_layers / p.pp * layer_params(GPT3) / p.tp
    for cast, per_param in ((0.0, 10.0), (8.0, 18.0)):
        sw = SoftwareFeatures(gradient_accumulation_fusion=False, grad_accum_cast_bytes=cast)
        unfused = one(p, software=sw)
        # The first and last stages also hold an embedding table, so they are the
        # slowest; the middle stages' cost is the floor of the added time.
        added = unfused["step_time_s"] - fused["step_time_s"]
        floor = (micro + p.pp - 1) * middle * per_param / hbm
        assert floor < added < floor * 1.2
        assert unfused["compute_s"] > fused["compute_s"]
    # fp16 accumulation (Megatron-LM of 2020-21) moves 2 + 2 x 2 bytes.
    def added(**kw):
        base = one(p, software=SoftwareFeatures(**kw))["step_time_s"]
        return one(p, software=SoftwareFeatures(gradient_accumulation_fusion=False,
                                                **kw))["step_time_s"] - base
    assert added(grad_reduce_bytes=2) == pytest.approx(0.6 * added(), rel=0.02)
    # A 16-bit accumulator adds in place: no 32-bit cast copy to pay for.
    assert added(grad_reduce_bytes=2, grad_accum_cast_bytes=8.0) == pytest.approx(
        added(grad_reduce_bytes=2), rel=1e-9)


FSDP_WORKLOAD = Workload(global_batch_size=512, seq_len=2048)
FSDP_CLUSTER = cluster_from_gpus(H100, 64, 8)


def _fsdp(gathers, overlap=True, **kw):
    """A pure data-parallel plan (FSDP): 64 H100, 13B-class GPT-3 layer, MBS 2."""
    model = get_model("gpt3", "13b")
    sw = SoftwareFeatures(param_gathers_per_microbatch=gathers, overlap_sharded_comm=overlap,
                          **kw)
    return one(Plan(tp=1, pp=1, dp=64, mbs=2, recompute="none", distributed_optimizer=True),
               workload=FSDP_WORKLOAD, cluster=FSDP_CLUSTER, model=model, software=sw)


def test_fsdp_traffic_per_microbatch_full_shard_over_shard_grad_op():
    """Unhidden, FULL_SHARD moves 2 gathers (bf16) + 1 reduce-scatter (fp32) of the
    parameters every micro-batch, SHARD_GRAD_OP one gather less: (2*2 + 4) / (2 + 4)."""
    full = _fsdp(2, overlap=False)["dp_comm_s"]
    grad_op = _fsdp(1, overlap=False)["dp_comm_s"]
    assert full > grad_op > 0
    assert full / grad_op == pytest.approx(8.0 / 6.0, rel=0.02)  # latency terms aside
    # Per micro-batch: 4x the micro-batches, 4x the traffic (the once-per-step
    # distributed-optimizer traffic of a Megatron plan does not scale so).
    few = one(Plan(tp=1, pp=1, dp=64, mbs=8, recompute="none", distributed_optimizer=True),
              workload=FSDP_WORKLOAD, cluster=FSDP_CLUSTER, model=get_model("gpt3", "13b"),
              software=SoftwareFeatures(param_gathers_per_microbatch=2,
                                        overlap_sharded_comm=False))["dp_comm_s"]
    assert full == pytest.approx(4.0 * few, rel=1e-6)


def test_fsdp_overlap_hides_traffic_behind_compute_but_not_the_first_gather():
    hidden = _fsdp(2)["dp_comm_s"]
    exposed = _fsdp(2, overlap=False)["dp_comm_s"]
    assert 0 < hidden < exposed
    megatron = _fsdp(0)
    assert _fsdp(2)["step_time_s"] > megatron["step_time_s"]
    # Everything but the dp traffic is the Megatron plan's.
    assert _fsdp(2)["compute_s"] == pytest.approx(megatron["compute_s"])


def test_tp_comm_overlap_hides_tp_traffic_behind_weight_gemms():
    p = plan(tp=8, pp=8, dp=16, mbs=1)
    plain = one(p)
    overlapped = one(p, software=SoftwareFeatures(tp_comm_overlap=True))
    assert plain["tp_comm_s"] > 0
    assert 0.0 <= overlapped["tp_comm_s"] < plain["tp_comm_s"]
    assert overlapped["step_time_s"] < plain["step_time_s"]
    assert overlapped["compute_s"] == pytest.approx(plain["compute_s"])
    # Overlap cannot hide TP traffic that does not exist.
    no_tp = plan(tp=1, pp=8, dp=128, sp=False)
    assert one(no_tp, software=SoftwareFeatures(tp_comm_overlap=True))["step_time_s"] == \
        pytest.approx(one(no_tp)["step_time_s"])


def test_fp8_speedup_is_fitted_inside_its_bounds():
    """The datasheet ratio (2.0) bounds the FP8 GEMM gain; the shipped value is a
    fitted constant, not the bound (H100 BF16 rows of S09 anchor the base)."""
    c = load_constants()
    assert 1.0 < c.fp8_gemm_speedup < 2.0
    assert c.efficiency_max(H100) < c.efficiency_max(A100)


LLAMA_LIKE = dataclasses.replace(GPT3, num_layers=32, hidden_size=4096, num_heads=32,
                                 num_kv_heads=8, ffn_hidden_size=14336, vocab_size=128256,
                                 mlp_kind="swiglu")


def _times(seq_len: int, constants=None, software=None, gpu=H100, p=None):
    from autoconfig.training.step_time import _forward_times
    p = p or Plan(tp=1, pp=1, dp=8, mbs=1)
    times = _forward_times(LLAMA_LIKE, Workload(64, seq_len), PlanTable.from_plans([p]), gpu,
                           constants or load_constants(), software or SoftwareFeatures())
    return {k: float(np.asarray(v)[0]) for k, v in times.items() if not isinstance(v, tuple)}


def test_flash_attention_time_plain_numbers():
    """Causal half of 4 s h per token forward, backward 2.5 x forward (the
    FlashAttention benchmarks' count), at the attention efficiency of the peak."""
    from autoconfig.training.step_time import _flash_attention_times
    fwd, bwd = _flash_attention_times(LLAMA_LIKE, 1000.0, 1000.0, 1.0, 1e12, 0.5)
    assert fwd == pytest.approx(0.5 * 4.0 * 1000 * 4096 * 1000 / (1e12 * 0.5))
    assert bwd == pytest.approx(2.5 * fwd)
    # TP splits the heads.
    fwd_tp, _ = _flash_attention_times(LLAMA_LIKE, 1000.0, 1000.0, 4.0, 1e12, 0.5)
    assert fwd_tp == pytest.approx(fwd / 4)


def test_attention_core_follows_the_heads_widths_not_the_hidden_size():
    """The core's FLOPs are 2 s a (d_qk + d_v) per token: Qwen3's 32 heads of 128
    on a 2048-wide stream do twice the 4 s h of a GPT shape, DeepSeek-V3's MLA
    heads (192 + 128 wide) 2.86 times it."""
    from autoconfig.training.step_time import _flash_attention_times
    for name, ratio in (("qwen3-30b-a3b", 2.0), ("deepseek-v3", 2.86)):
        model = get_model(name)
        fwd, _ = _flash_attention_times(model, 1000.0, 1000.0, 1.0, 1e12, 0.5)
        gpt_shape = 0.5 * 4.0 * 1000 * model.hidden_size * 1000 / (1e12 * 0.5)
        assert fwd / gpt_shape == pytest.approx(ratio, rel=0.01)
        assert fwd == pytest.approx(0.5 * attention_core_flops_per_token(model, 1000) * 1000
                                    / (1e12 * 0.5))


def test_fused_attention_pays_a_fixed_cost_per_query_tile():
    """efficiency x L / (L + cp x tile + causal extra), L the keys per query (s/2
    causal, s without a mask); ring CP pays the tile cost once per step."""
    from autoconfig.training.step_time import _flash_attention_times
    plain, _ = _flash_attention_times(LLAMA_LIKE, 2048.0, 2048.0, 1.0, 1e12, 0.5)
    tiled, tiled_bwd = _flash_attention_times(LLAMA_LIKE, 2048.0, 2048.0, 1.0, 1e12, 0.5,
                                              1.0, 240.0, 176.0)
    assert tiled == pytest.approx(plain * (1024 + 240 + 176) / 1024)
    assert tiled_bwd == pytest.approx(2.5 * tiled)
    ring, _ = _flash_attention_times(LLAMA_LIKE, 2048.0, 512.0, 1.0, 1e12, 0.5, 4.0, 240.0, 176.0)
    assert ring == pytest.approx(plain / 4 * (1024 + 4 * 240 + 176) / 1024)
    whole, _ = _flash_attention_times(LLAMA_LIKE, 2048.0, 2048.0, 1.0, 1e12, 0.5, 1.0, 240.0,
                                      176.0, causal=False)
    assert whole == pytest.approx(2 * plain * (2048 + 240) / 2048)
    # Long rows approach the asymptote: within 3% at 64K causal tokens.
    long, _ = _flash_attention_times(LLAMA_LIKE, 65536.0, 65536.0, 1.0, 1e12, 0.5, 1.0, 240.0,
                                     176.0)
    flat, _ = _flash_attention_times(LLAMA_LIKE, 65536.0, 65536.0, 1.0, 1e12, 0.5)
    assert 1.0 < long / flat < 1.03


def test_shipped_attention_law_follows_the_h100_measurements():
    """The shipped Hopper tile costs and efficiency against every cuDNN head-dim-128
    point measured on an H100 (benchmarks/gpu/attention.csv): within 10%, where a
    constant efficiency is 78% off at 1K causal tokens."""
    import pandas as pd
    from autoconfig.paths import benchmarks_dir
    a = pd.read_csv(benchmarks_dir() / "gpu" / "attention.csv")
    a = a[(a.backend == "cudnn") & (a.head_dim == 128)]
    measured = 3.5 / (1.0 / a.fwd_tflops + 2.5 / a.bwd_tflops) * 1e12
    c = load_constants()
    tile, causal = c.attention_tile_costs(H100)
    assert tile > 0 and causal > 0
    from autoconfig.training.step_time import _flash_attention_times
    for row, rate in zip(a.itertuples(), measured):
        tokens = float(row.seq * row.batch)
        fwd, bwd = _flash_attention_times(LLAMA_LIKE, float(row.seq), tokens, 1.0,
                                          H100.peak_bf16_tflops * 1e12,
                                          c.attention_efficiency_of(H100), 1.0, tile, causal,
                                          causal=bool(row.causal))
        flops = 3.5 * (0.5 if row.causal else 1.0) * 4.0 * row.seq * LLAMA_LIKE.hidden_size \
            * tokens
        assert flops / (fwd + bwd) == pytest.approx(rate, rel=0.10), (row.seq, row.causal)


def test_attention_time_quadratic_in_seq_per_sequence_linear_per_token():
    # Without the per-tile cost (test_fused_attention_pays_a_fixed_cost_per_query_tile).
    flat = dataclasses.replace(load_constants(), attention_tile_keys={}, attention_causal_keys={})
    short, long = _times(8192, flat), _times(32768, flat)
    # One micro-batch of one sequence: 4x tokens -> 16x attention, 4x per token.
    assert long["attention"] / short["attention"] == pytest.approx(16.0)
    assert long["attention_backward"] / short["attention_backward"] == pytest.approx(16.0)
    # Weight GEMMs stay about linear in tokens (a little under: a bigger M wastes less).
    assert 3.8 < long["weight_gemm"] / short["weight_gemm"] <= 4.0
    # So attention's share of the layer grows with the sequence.
    assert long["attention"] / long["layer"] > short["attention"] / short["layer"]


def test_lower_attention_efficiency_is_slower_and_leaves_mfu_accounting_alone():
    base = load_constants()
    slower = dataclasses.replace(base, attention_efficiency={
        k: {g: v / 2 for g, v in table.items()} for k, table in base.attention_efficiency.items()})
    wl, cluster, p = Workload(64, 32768), cluster_from_gpus(H100, 64, 8), Plan(tp=8, pp=1, dp=8,
                                                                              sp=True)
    fast = one(p, workload=wl, cluster=cluster, model=LLAMA_LIKE, constants=base)
    slow = one(p, workload=wl, cluster=cluster, model=LLAMA_LIKE, constants=slower)
    assert slow["step_time_s"] > fast["step_time_s"]
    assert slow["compute_s"] > fast["compute_s"]
    # Halving the efficiency doubles exactly the attention seconds.
    t_fast, t_slow = _times(32768, base), _times(32768, slower)
    assert t_slow["attention"] == pytest.approx(2 * t_fast["attention"])
    assert t_slow["weight_gemm"] == pytest.approx(t_fast["weight_gemm"])
    # MFU still counts the model FLOPs (whole score matrix, backward 2x forward).
    for perf in (fast, slow):
        flops = perf["tokens_per_s_per_gpu"] * model_flops_per_token(LLAMA_LIKE, 32768)
        assert perf["model_tflops_per_gpu"] == pytest.approx(flops / 1e12)
        assert perf["mfu"] == pytest.approx(flops / (H100.peak_bf16_tflops * 1e12))


def test_attention_backward_counts_in_compute_and_recompute_counts_forward_only():
    sw = SoftwareFeatures()
    wl, cluster = Workload(64, 16384), cluster_from_gpus(H100, 64, 8)
    none = one(Plan(tp=8, pp=1, dp=8, sp=True), workload=wl, cluster=cluster, model=LLAMA_LIKE)
    sel = one(Plan(tp=8, pp=1, dp=8, sp=True, recompute="selective"), workload=wl,
              cluster=cluster, model=LLAMA_LIKE)
    t = _times(16384, software=sw, p=Plan(tp=8, pp=1, dp=8, sp=True))
    micro = 64 / 8
    # Selective recompute repeats the attention forward of every layer, not its backward.
    assert sel["recompute_s"] == pytest.approx(micro * LLAMA_LIKE.num_layers * t["attention"])
    assert none["recompute_s"] == 0.0
    layer = 3 * (t["layer"] - t["attention"]) + t["attention"] + t["attention_backward"]
    assert none["compute_s"] == pytest.approx(
        micro * (LLAMA_LIKE.num_layers * layer + 3 * t["logits"] + t["loss"]))


def test_attention_kernel_lookup_falls_back_to_fused_then_gemm():
    c = load_constants()
    b200 = get_gpu("b200")
    assert c.attention_efficiency_of(H100, "llm-foundry") != c.attention_efficiency_of(H100)
    assert c.attention_efficiency_of(b200, "llm-foundry") == c.attention_efficiency_of(b200)
    assert c.attention_efficiency_of(A100, "no-such-kernel") == c.attention_efficiency_of(A100)
    bare = dataclasses.replace(c, attention_efficiency={})
    assert bare.attention_efficiency_of(H100) == bare.efficiency_max(H100)


def test_unfused_attention_ignores_the_flash_efficiency():
    """Rows run without fused attention (2020-22 Megatron, BLOOM) keep the unfused
    treatment: whole score matrix at GEMM efficiency plus the s^2 traffic."""
    base = load_constants()
    other = dataclasses.replace(base, attention_efficiency={"fused": {"ampere": 0.05}})
    sw = SoftwareFeatures(flash_attention=False)
    assert one(plan(), software=sw, constants=other)["step_time_s"] == \
        pytest.approx(one(plan(), software=sw, constants=base)["step_time_s"])
    t = _times(2048, software=sw, gpu=A100)
    assert t["attention_backward"] == pytest.approx(2 * t["attention"])
    assert t["scores"] > 0


def test_shipped_attention_efficiencies_are_fractions_below_the_gemm_ones():
    c = load_constants()
    for table in c.attention_efficiency.values():
        assert all(0.0 < v < 1.0 for v in table.values())
    # Flash kernels run below large GEMMs (FlashAttention-2/-3 papers), and TE's
    # cuDNN / FlashAttention-3 class kernel on H100 ahead of llm-foundry's.
    for gpu in (A100, H100):
        assert c.attention_efficiency_of(gpu, "llm-foundry") < c.efficiency_max(gpu)
    assert c.attention_efficiency_of(H100) > c.attention_efficiency_of(H100, "llm-foundry")


def test_attention_efficiency_must_be_kernel_then_generation(tmp_path):
    from autoconfig.errors import CatalogError
    from autoconfig.paths import heuristics_dir
    text = (heuristics_dir() / "perf.yaml").read_text()
    flat = text.replace("attention_efficiency:\n", "attention_efficiency:\n  hopper: "
                        "{value: 0.5, source: test}\n", 1)
    path = tmp_path / "perf.yaml"
    path.write_text(flat)
    with pytest.raises(CatalogError, match="attention_efficiency"):
        load_constants(path)


def test_unfused_attention_slows_to_cuda_cores_when_heads_break_alignment():
    """Head dimension 108 (BLOOM's 13824 hidden over 128 heads) is no multiple of 8:
    the unfused score and context GEMMs leave the tensor cores for the CUDA cores,
    4x slower on an A100 (78 against 312 TFLOPS); 104 (13312 / 128) stays aligned.
    Fused attention and a GPU without a published non-tensor peak are untouched."""
    unfused = SoftwareFeatures(flash_attention=False)
    p = plan(recompute="full")

    def attention_s(hidden, gpu=A100, software=unfused):
        model = dataclasses.replace(GPT3, hidden_size=hidden, num_heads=128, num_kv_heads=128,
                                    ffn_hidden_size=4 * hidden)
        cluster = cluster_from_gpus(gpu, 1024, 8)
        base = one(p, model=model, cluster=cluster, software=software)
        faster = dataclasses.replace(gpu, peak_fp16_vector_tflops=None)
        plain = one(p, model=model, cluster=cluster_from_gpus(faster, 1024, 8), software=software)
        return base["step_time_s"], plain["step_time_s"]

    misaligned, without_penalty = attention_s(13824)
    assert misaligned > without_penalty * 1.05
    aligned, same = attention_s(13312)
    assert aligned == same
    fused, fused_plain = attention_s(13824, software=SoftwareFeatures())
    assert fused == fused_plain


def test_fp8_recipes_differ_by_their_quantisation_traffic_only():
    """Current scaling reads each GEMM input once more than delayed scaling (its
    amax pass), so its step is longer by exactly that traffic at HBM speed; the
    block-scaled recipes add only their scales; bf16 casts nothing."""
    from autoconfig.training.fp8 import cast_bytes_per_element
    from autoconfig.training.step_time import _fp8_cast_bytes_per_layer
    b200 = get_gpu("b200")
    cluster = cluster_from_gpus(b200, 8, 8)
    p, fp8 = Plan(tp=1, pp=1, dp=8, mbs=1), Workload(64, 4096, "fp8")
    c = load_constants()

    def step(recipe):
        return one(p, workload=fp8, cluster=cluster, model=LLAMA_LIKE, constants=c,
                   software=SoftwareFeatures(fp8_recipe=recipe))["step_time_s"]

    times = {r: step(r) for r in ("delayed", "tensorwise", "mxfp8", "blockwise")}
    assert times["delayed"] < times["mxfp8"] < times["tensorwise"]
    assert times["mxfp8"] == pytest.approx(times["blockwise"])
    # the difference is the extra 2 B per element read, 3 x forward (fwd + bwd), per layer
    tokens = 4096.0
    extra = _fp8_cast_bytes_per_layer(LLAMA_LIKE, tokens, 1.0,
                                      cast_bytes_per_element("tensorwise")
                                      - cast_bytes_per_element("delayed"))
    micro_batches = 64 // 8
    hbm = b200.hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency
    per_layer = 3.0 * extra * c.elementwise_traffic_factor / hbm
    assert times["tensorwise"] - times["delayed"] == pytest.approx(
        per_layer * LLAMA_LIKE.num_layers * micro_batches, rel=0.02)
    # the default on Blackwell is MXFP8, as the Megatron-Bridge recipes run
    assert step("") == pytest.approx(times["mxfp8"])


def test_fp8_casts_follow_the_layers_own_linears():
    """2h + (h + f)/t per token for a GPT-like layer; the projection's input is the
    heads' value width; an MoE layer casts its shared experts' inputs, not a dense
    MLP's (its routed copies' casts are counted with their traffic)."""
    from autoconfig.training.step_time import _fp8_cast_bytes_per_layer
    h, f = LLAMA_LIKE.hidden_size, LLAMA_LIKE.ffn_hidden_size
    assert _fp8_cast_bytes_per_layer(LLAMA_LIKE, 10.0, 4.0, 1.0) == pytest.approx(
        10.0 * (2 * h + (h + f) / 4))
    qwen = get_model("qwen3-30b-a3b")                # 32 heads of 128 on a 2048 stream
    dense = _fp8_cast_bytes_per_layer(qwen, 1.0, 1.0, 1.0)
    assert dense == pytest.approx(2 * 2048 + 32 * 128 + qwen.ffn_hidden_size)
    moe = _fp8_cast_bytes_per_layer(qwen, 1.0, 1.0, 1.0, "moe")
    assert moe == pytest.approx(2048 + 32 * 128)     # no shared experts: attention only
    wider = dataclasses.replace(qwen, ffn_hidden_size=2 * qwen.ffn_hidden_size)
    assert _fp8_cast_bytes_per_layer(wider, 1.0, 1.0, 1.0, "moe") == moe
    ds = get_model("deepseek-v3")                    # MLA's down and up projections too
    mla = _fp8_cast_bytes_per_layer(ds, 1.0, 1.0, 1.0, "moe")
    assert mla == pytest.approx(2 * 7168 + ds.q_lora_rank + ds.kv_lora_rank + 128 * 128
                                + 7168 + ds.moe_shared_expert_ffn_hidden_size)


def test_nvfp4_gemms_gain_the_fp4_rate_plus_a_measured_fixed_part():
    """An NVFP4 GEMM takes the FP8 GEMM's time x (FP8 peak / FP4 peak) plus a part
    that does not speed up (0.19 of it, measured on a B300), so a GB300 (3x FP4
    over FP8) gains more over MXFP8 than a GB200 (2x), each less than its peak
    ratio; GPUs without FP4 tensor cores or a confirmed FP4 peak refuse it."""
    from autoconfig.errors import InputError
    from autoconfig.training.fp8 import check_nvfp4, nvfp4_gemm_speedup, nvfp4_value
    c = load_constants()
    fixed = nvfp4_value("fp4_time_beyond_peak_vs_fp8")
    assert 0.0 < fixed < 0.5
    gains = {}
    for name in ("gb200", "gb300"):
        gpu = get_gpu(name)
        ratio = gpu.peak_nvfp4_tflops / gpu.peak_fp8_tflops
        assert nvfp4_gemm_speedup(c.fp8_gemm_speedup, gpu) == pytest.approx(
            c.fp8_gemm_speedup / (1.0 / ratio + fixed))
        cluster = cluster_from_gpus(gpu, 8, gpu.gpus_per_node)
        p = Plan(tp=1, pp=1, dp=8, mbs=1)

        def step(precision, recipe=""):
            return one(p, workload=Workload(64, 4096, precision), cluster=cluster,
                       model=LLAMA_LIKE, constants=c,
                       software=SoftwareFeatures(fp8_recipe=recipe))["step_time_s"]
        gains[name] = step("fp8", "mxfp8") / step("nvfp4")
        assert 1.0 < gains[name] < ratio
    assert gains["gb300"] > gains["gb200"]
    for name in ("h100-80gb", "b300"):   # Hopper: no FP4; B300: no confirmed FP4 peak
        with pytest.raises(InputError, match="nvfp4"):
            check_nvfp4(get_gpu(name))


def test_nvfp4_gemm_inputs_are_half_byte_elements():
    """The roofline reads NVFP4 inputs as 0.5625-byte elements: with the same
    speed-up a thin GEMM (small M) takes less time than with FP8's 1-byte inputs,
    a huge square one the same."""
    args = (1e12, 64, 8192, 8192, 1e15, 0.6, 300.0, 0.5, 3.0)
    assert gemm_time_s(*args, input_bytes=0.5625) < gemm_time_s(*args, input_bytes=1.0)
    big = (1e15, 1e7, 1e7, 1e7, 1e15, 0.6, 300.0, 0.5, 3.0)
    assert gemm_time_s(*big, input_bytes=0.5625) == pytest.approx(
        gemm_time_s(*big, input_bytes=1.0), rel=1e-4)



def test_fp8_gemms_gain_less_when_small():
    """FP8 speeds a GEMM's compute up and halves its inputs' bytes, not its bf16
    output's: a large square GEMM gains nearly the full speed-up, a thin one
    (an MoE expert's K = 768 down projection at 1K tokens) less: 1.57x here,
    1.34x measured on an H200 (benchmarks/gpu/h200/grouped_gemm.csv, against
    1.7-2.0x for DeepSeek-V3's experts); bf16 is unchanged by the FP8 terms."""
    peak, eff, f = 989e12, 0.7, 0.5
    ridge = peak / (3350e9 / 2)

    def gain(m, n, k, speedup=1.8):
        flops = 2.0 * m * n * k
        bf16 = gemm_time_s(flops, m, n, k, peak, eff, ridge, f)
        assert bf16 == gemm_time_s(flops, m, n, k, peak, eff, ridge, f, None)
        return bf16 / gemm_time_s(flops, m, n, k, peak, eff, ridge, f, speedup)

    large, thin = gain(16384, 16384, 16384), gain(1024, 2048, 768)
    assert 1.7 < large < 1.8
    assert thin < 1.6 < large
    # exactly the roofline's terms: compute over the speed-up, half the input bytes
    m, n, k = 1024.0, 2048.0, 768.0
    fp8 = gemm_time_s(2 * m * n * k, m, n, k, peak, eff, ridge, f, 1.8)
    assert fp8 == pytest.approx(2 * m * n * k / (eff * peak)
                                * (1 / 1.8 + f * ridge * (0.5 / m + 0.5 / n + 1 / k)))


def test_blockwise_gemms_run_slower_on_hopper_only():
    """Hopper applies 1x128 / 128x128 block scales in the GEMM's main loop
    (measured 1.34x per-tensor's step GEMM time on an H200): a blockwise step
    on an H100 is longer than a delayed one by that share of its GEMMs plus the
    scales' cast traffic; on Blackwell, whose tensor cores apply block scales,
    blockwise costs what MXFP8 does (the other recipe test)."""
    from autoconfig.training.fp8 import gemm_time_vs_per_tensor
    from autoconfig.training.step_time import _forward_times
    h100 = get_gpu("h100-80gb")
    cluster = cluster_from_gpus(h100, 8, 8)
    p, fp8 = Plan(tp=1, pp=1, dp=8, mbs=1), Workload(64, 4096, "fp8")
    c = load_constants()
    slow = gemm_time_vs_per_tensor("blockwise", "hopper")
    assert slow > 1.2
    assert gemm_time_vs_per_tensor("blockwise", "blackwell") == 1.0
    assert gemm_time_vs_per_tensor("tensorwise", "hopper") == 1.0

    def layer(recipe):
        sw = SoftwareFeatures(fp8_recipe=recipe)
        return _forward_times(LLAMA_LIKE, fp8, PlanTable.from_plans([p]), h100, c, sw)

    block, delayed = layer("blockwise"), layer("delayed")
    # the slow-down is the compute's; the operands' bytes move as fast as before
    for part in ("weight_gemm", "logits"):
        assert delayed[part] * 1.1 < block[part] < delayed[part] * slow
    assert block["attention"] == pytest.approx(delayed["attention"])

    def step(recipe):
        return one(p, workload=fp8, cluster=cluster, model=LLAMA_LIKE, constants=c,
                   software=SoftwareFeatures(fp8_recipe=recipe))["step_time_s"]

    assert step("blockwise") > 1.15 * step("tensorwise") > step("delayed")


def test_fp8_recipe_is_checked_against_the_gpu_and_the_precision():
    from autoconfig.errors import InputError
    from autoconfig.training.fp8 import check_fp8_recipe, run_recipe
    h100 = get_gpu("h100-80gb")
    assert run_recipe("", h100) == "tensorwise" and run_recipe("current", h100) == "tensorwise"
    with pytest.raises(InputError, match="mxfp8 on h100-80gb.*blackwell"):
        run_recipe("mxfp8", h100)
    with pytest.raises(InputError, match="invalid --fp8-recipe 'fp4'"):
        run_recipe("fp4", h100)
    plain = SoftwareFeatures()
    with pytest.raises(InputError, match="needs --precision fp8"):
        check_fp8_recipe(SoftwareFeatures(fp8_recipe="delayed"), plain, Workload(8, 2048), h100)
    # a stack's own recipe is no error on a bf16 run (llm-foundry runs delayed scaling)
    check_fp8_recipe(SoftwareFeatures(fp8_recipe="delayed"),
                     SoftwareFeatures(fp8_recipe="delayed"), Workload(8, 2048), h100)


def test_param_gather_hides_behind_the_forward_and_the_reduce_behind_the_backward():
    """With the distributed optimizer the gradient reduce-scatter hides behind the
    last micro-batch's backward (--overlap-grad-reduce) and the parameter
    all-gather behind the next step's first forward (--overlap-param-gather), each
    in its own window; the gather overlaps only with the grad reduce overlapped
    (Megatron-LM refuses it otherwise)."""
    model = get_model("gpt3", "13b")
    cluster = cluster_from_gpus(H100, 512, 8)
    wl = Workload(global_batch_size=256, seq_len=2048)
    p = Plan(tp=2, pp=1, dp=256, mbs=1, recompute="none", sp=True, distributed_optimizer=True)

    def dp(**kw):
        return one(p, workload=wl, cluster=cluster, model=model,
                   software=SoftwareFeatures(**kw))["dp_comm_s"]

    exposed = dp(overlap_grad_reduce=False, overlap_param_gather=False)
    reduce_only = dp(overlap_grad_reduce=True, overlap_param_gather=False)
    both = dp(overlap_grad_reduce=True, overlap_param_gather=True)
    assert exposed > reduce_only > both
    # The all-gather is bf16 and the reduce-scatter fp32: with only the reduce
    # overlapped, at least the whole gather (a third of the traffic) stays exposed.
    assert reduce_only >= exposed / 3.0 * (1 - 1e-6)
    # Without the overlapped reduce the param-gather switch changes nothing.
    assert dp(overlap_grad_reduce=False, overlap_param_gather=True) == pytest.approx(exposed)


def test_cross_entropy_streams_the_logits_at_its_kernels_bytes():
    """The loss reads and writes the last stage's tokens x vocab/tp logits: the
    step grows by (micro-batches) x tokens x V/t x bytes / HBM between two
    implementations, on the stage with the output layer only."""
    c = load_constants()
    p = plan(pp=1, dp=128, tp=8, recompute="full")
    micro = WORKLOAD.global_batch_size / (p.mbs * p.dp)
    hbm = A100.hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency
    logits = p.mbs * WORKLOAD.seq_len * GPT3.vocab_size / p.tp
    steps = {k: one(p, software=SoftwareFeatures(cross_entropy=k))["step_time_s"]
             for k in ("unfused", "native", "te", "flash-attn")}
    assert steps["unfused"] > steps["native"] > steps["te"] > steps["flash-attn"]
    bytes_ = c.cross_entropy_bytes_per_logit
    assert steps["unfused"] - steps["te"] == pytest.approx(
        micro * logits * (bytes_["unfused"] - bytes_["te"]) / hbm, rel=1e-6)
    # Pipelined, only the last stage pays it: the step grows by less than m + pp - 1
    # of the per-micro-batch cost, and at least by m of it (the slowest stage).
    pp = plan(pp=8, dp=16)
    m = WORKLOAD.global_batch_size / (pp.mbs * pp.dp)
    per = pp.mbs * WORKLOAD.seq_len * GPT3.vocab_size / pp.tp * (
        bytes_["unfused"] - bytes_["te"]) / hbm
    grown = (one(pp, software=SoftwareFeatures(cross_entropy="unfused"))["step_time_s"]
             - one(pp, software=SoftwareFeatures(cross_entropy="te"))["step_time_s"])
    assert m * per * (1 - 1e-6) <= grown <= (m + pp.pp - 1) * per * (1 + 1e-6)


def test_shipped_cross_entropy_bytes_are_sourced_and_ordered():
    c = load_constants()
    b = c.cross_entropy_bytes_per_logit
    assert set(b) == {"unfused", "native", "te", "flash-attn", "torch"}
    assert b["unfused"] > b["native"] > b["te"] > b["flash-attn"] > 0
    with pytest.raises(Exception, match="cross_entropy_bytes_per_logit"):
        dataclasses.replace(c, cross_entropy_bytes_per_logit={}).cross_entropy_bytes("te")


def test_one_bucket_of_the_overlapped_dp_traffic_always_shows():
    """Overlapped, the bucket with the first layers is reduced only after the
    backward and gathered before the first forward: at least bucket/params of each
    collective stays exposed; with one bucket (few parameters per GPU, a large DP
    group: max(40M, 1M x DP) parameters) nothing hides."""
    from autoconfig.core.model import embedding_params, layer_params
    model = get_model("gpt3", "1.3b")
    c = load_constants()
    params = model.num_layers * layer_params(model) + embedding_params(model)
    wl = Workload(global_batch_size=4096, seq_len=2048)
    sw = SoftwareFeatures(overlap_grad_reduce=True, overlap_param_gather=True)
    off = SoftwareFeatures(overlap_grad_reduce=False, overlap_param_gather=False)
    small = Plan(tp=1, pp=1, dp=32, mbs=4, recompute="none", distributed_optimizer=True)
    large = dataclasses.replace(small, dp=2048)
    for p, gpus in ((small, 32), (large, 2048)):
        cluster = cluster_from_gpus(H100, gpus, 8)
        hidden = one(p, workload=wl, cluster=cluster, model=model, software=sw)["dp_comm_s"]
        exposed = one(p, workload=wl, cluster=cluster, model=model, software=off)["dp_comm_s"]
        bucket = max(c.grad_bucket_params["min"], c.grad_bucket_params["per_rank"] * p.dp)
        assert hidden >= min(1.0, bucket / params) * exposed * (1 - 1e-6)
        if bucket >= params * 1.5:
            assert hidden == pytest.approx(exposed)
