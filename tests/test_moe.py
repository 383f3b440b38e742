"""Mixture-of-experts models end to end: counts, plan space, memory, step time,
inference and the CLI, each against a figure derived independently or an
invariant that must hold."""

import dataclasses
import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model, with_layers
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import active_params, model_flops_per_token, total_params
from autoconfig.core.plan import (Plan, PlanTable, Workload, is_short_last_layout,
                                  short_last_stage_split, stage_kind_columns)
from autoconfig.errors import InputError
from autoconfig.training import memory
from autoconfig.training.space import (R_EP_EXPERTS, R_EP_FOLD, AxisChoices, enumerate_plans)
from autoconfig.training.stack import load_stack, with_overrides
from autoconfig.training.step_time import step_time
from tests.cli_runner import run_cli

GIB = 2**30


# ---------------------------------------------------------------- counts

@pytest.mark.parametrize("name, total_b, active_b, tolerance", [
    # published totals: DeepSeek-V3 report (671B / 37B), Qwen3 report Table 2 (30.5B / 3.3B,
    # 235B / 22B), Mixtral paper (46.7B / 12.9B), Kimi K2 README (1T / 32B)
    ("deepseek-v3", 671, 37, 0.02), ("qwen3-30b-a3b", 30.5, 3.3, 0.02),
    ("qwen3-235b-a22b", 235, 22, 0.02), ("mixtral-8x7b", 46.7, 12.9, 0.01),
    ("kimi-k2", 1000, 32, 0.03)])
def test_total_and_active_parameters_match_the_publications(name, total_b, active_b, tolerance):
    m = get_model(name)
    assert total_params(m) / 1e9 == pytest.approx(total_b, rel=tolerance)
    assert active_params(m) / 1e9 == pytest.approx(active_b, rel=tolerance + 0.01)


def test_deepseek_v3_counts_by_hand():
    """MLA attention of one layer, counted from the report's dimensions: q down 7168 x 1536
    (+ its norm), q up 1536 x 128 x 192, kv down 7168 x 576 (+ norm 512), kv up
    512 x 128 x 256, output 128 x 128 x 7168, two RMSNorms of 7168."""
    m = get_model("deepseek-v3")
    attention = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256
                 + 128 * 128 * 7168 + 2 * 7168)
    expert = 3 * 7168 * 2048
    moe = attention + 7168 * 256 + 256 * expert + expert
    dense = attention + 3 * 7168 * 18432
    embeddings = 2 * 129280 * 7168 + 7168
    assert total_params(m) == 3 * dense + 58 * moe + embeddings
    assert active_params(m) == 3 * dense + 58 * (attention + 7168 * 256 + 9 * expert) + embeddings
    assert m.layer_pattern[:4] == ("dense", "dense", "dense", "moe")


def test_moe_flops_follow_active_parameters_not_total():
    m = get_model("deepseek-v3")
    flops = model_flops_per_token(m, 4096)
    assert 5.5 * active_params(m) < flops < 9 * active_params(m)
    assert flops < total_params(m)  # a dense 671B would be ~6 x 671e9


@pytest.mark.parametrize("change, what", [
    ({"moe_topk": 9}, "moe_topk"), ({"moe_ffn_hidden_size": 0}, "moe_ffn_hidden_size"),
    ({"moe_first_dense_layers": 99}, "moe_first_dense_layers"),
    ({"kv_lora_rank": -1}, "kv_lora_rank")])
def test_bad_moe_fields_are_one_line_errors(change, what):
    with pytest.raises(InputError, match=what):
        with_layers(get_model("mixtral-8x7b"), **change)


# ---------------------------------------------------------------- plan space

def _cluster(gpu="h100", gpus=64, per_node=8):
    return Cluster(get_gpu(gpu), gpus // per_node, per_node)


def test_expert_parallel_rules_are_megatrons_and_counted():
    space = enumerate_plans(get_model("mixtral-8x7b"), Workload(512, 4096), _cluster(),
                            AxisChoices(ep=(1, 2, 3, 8, 16), mbs=(1,)))
    plans = space.plans
    assert set(plans.ep) == {1, 2, 8}                       # 3 and 16 do not divide 8 experts
    assert space.rejected[R_EP_EXPERTS] > 0
    stage = plans.tp * plans.cp * plans.dp
    assert ((stage % (plans.ep * plans.etp)) == 0).all()    # experts fold into the stage ranks
    assert set(np.unique(plans.etp)) <= {1, 2, 4, 8}
    sp_off_at_tp = (plans.tp > 1) & ~plans.sp
    assert not sp_off_at_tp.any()
    folded = enumerate_plans(get_model("mixtral-8x7b"), Workload(512, 4096), _cluster(gpus=8),
                             AxisChoices(ep=(8,), etp=(2,), tp=(1,), pp=(2,), mbs=(1,)))
    assert folded.rejected.get(R_EP_FOLD, 0) > 0 and len(folded.plans) == 0


def test_dense_models_search_no_expert_axis():
    space = enumerate_plans(get_model("llama3-8b"), Workload(128, 8192), _cluster(gpus=8))
    assert set(space.plans.ep) == {1} and set(space.plans.etp) == {1}


def test_short_last_layout_is_bridges_deepseek_v3_layout():
    # Et*4|(t*4|)*14tmL: PP 4 VP 4 -> 16, 16, 16, 13; PP 8 VP 1 -> 8 x 7 and 5
    assert short_last_stage_split(61, 4, 4) == 13 and short_last_stage_split(61, 8) == 5
    assert short_last_stage_split(61, 2, 8) == 29
    assert bool(is_short_last_layout(61, 4, 4, 0, 13))
    space = enumerate_plans(get_model("deepseek-v3"), Workload(4096, 4096, "fp8"),
                            _cluster("gb200", 256, 4), AxisChoices(tp=(1,), pp=(4,), vp=(4,),
                                                                    ep=(64,), mbs=(1,)))
    assert len(space.plans) and set(space.plans.last_stage_layers) == {13}


def test_leading_dense_layers_sit_on_the_first_stage():
    m = get_model("deepseek-v3")
    kinds = stage_kind_columns(m, np.array([4]), np.array([0]), np.array([13]))
    assert kinds["first"]["dense"][0] == 3 and kinds["first"]["moe"][0] == 13
    assert kinds["last"]["dense"][0] == 0 and kinds["last"]["moe"][0] == 13


# ---------------------------------------------------------------- memory

def _one(model, plan, workload, software=None):
    return memory.memory_breakdown(model, workload, PlanTable.from_plans([plan]),
                                   software=software or load_stack("nemo").features)


def _plan(**kw):
    base = dict(tp=1, pp=1, dp=8, mbs=1, distributed_optimizer=True, ep=1)
    base.update(kw)
    return Plan(**base)


def test_expert_weights_and_optimizer_shard_over_expert_parallelism():
    m, w = get_model("qwen3-30b-a3b"), Workload(512, 4096)
    one, eight = _one(m, _plan(ep=1), w), _one(m, _plan(ep=8), w)
    assert eight.weights_bytes[0] < one.weights_bytes[0] / 4
    # the distributed optimizer shards experts over the expert data-parallel group (8/ep)
    no_ep_opt = _one(m, _plan(ep=1, distributed_optimizer=False), w).optimizer_bytes[0]
    assert one.optimizer_bytes[0] == pytest.approx(no_ep_opt / 8, rel=1e-6)


def test_recompute_modules_drop_what_they_recompute():
    m, w = get_model("deepseek-v3"), Workload(4096, 4096, "fp8")
    plan = dict(pp=4, vp=4, dp=64, ep=64, last_stage_layers=13)
    none = _one(m, _plan(**plan), w).activations_bytes[0]
    mla = _one(m, _plan(**plan, recompute="selective", recompute_modules="mla_up_proj"),
               w).activations_bytes[0]
    mlp = _one(m, _plan(**plan, recompute="selective", recompute_modules="mla_up_proj,mlp"),
               w).activations_bytes[0]
    assert mlp < mla < none


def test_mtp_module_weighs_on_the_last_stage_only():
    m = get_model("deepseek-v3")
    without = dataclasses.replace(m, mtp_layers=0)
    w, plan = Workload(4096, 4096), PlanTable.from_plans([_plan(pp=8, dp=32, ep=32,
                                                                 last_stage_layers=5)])
    for stage, grows in (("first", False), ("last", True)):
        a = memory.stage_breakdown(m, w, plan, stage).weights_bytes[0]
        b = memory.stage_breakdown(without, w, plan, stage).weights_bytes[0]
        assert (a > b) == grows


# ---------------------------------------------------------------- step time

def _time(model, plan, workload, cluster, **overrides):
    # dispatch exposed unless a test asks for the overlap (the nemo stack's default is on)
    sw = with_overrides(load_stack("nemo").features, **{"moe_a2a_overlap": False,
                                                        "moe_dispatcher": "alltoall",
                                                        **overrides})
    return step_time(model, workload, PlanTable.from_plans([plan]), cluster, software=sw)


def test_dispatch_crossing_the_nvlink_domain_costs_more():
    m, w = get_model("qwen3-30b-a3b"), Workload(512, 4096)
    inside = _time(m, _plan(dp=8, ep=8), w, _cluster(gpus=8))
    across = _time(m, _plan(dp=16, ep=16), Workload(1024, 4096), _cluster(gpus=16))
    assert inside.ep_comm_s[0] > 0
    assert across.ep_comm_s[0] / 2 > inside.ep_comm_s[0]    # per token: over the NICs
    single = _time(m, _plan(dp=8, ep=1), w, _cluster(gpus=8))
    assert single.ep_comm_s[0] == 0


def test_a2a_overlap_hides_dispatch_and_imbalance_slows_experts():
    m, w, c = get_model("deepseek-v3"), Workload(4096, 4096, "fp8"), _cluster("gb200", 256, 4)
    plan = _plan(pp=4, vp=4, dp=64, ep=64, last_stage_layers=13, recompute="selective",
                 recompute_modules="mla_up_proj")
    plain = _time(m, plan, w, c)
    hidden = _time(m, plan, w, c, moe_a2a_overlap=True)
    assert hidden.ep_comm_s[0] < plain.ep_comm_s[0]
    skewed = _time(m, plan, w, c, moe_imbalance=1.5)
    capped = _time(m, plan, w, c, moe_imbalance=1.5, moe_capacity_factor=1.2)
    assert plain.step_time_s[0] < capped.step_time_s[0] < skewed.step_time_s[0]


def test_a2a_overlap_only_where_megatron_core_accepts_it():
    # megatron-core refuses the overlap with PP > 1 and no virtual stages, with full
    # recompute and with the allgather dispatcher: the launch files leave it off
    # there, so the prediction must pay the whole dispatch too.
    m, w, c = get_model("deepseek-v3"), Workload(4096, 4096, "fp8"), _cluster("gb200", 256, 4)
    for plan, dispatcher in ((_plan(pp=4, dp=64, ep=64, last_stage_layers=13), "alltoall"),
                             (_plan(pp=4, vp=4, dp=64, ep=64, last_stage_layers=13,
                                    recompute="full"), "alltoall"),
                             (_plan(pp=4, vp=4, dp=64, ep=64, last_stage_layers=13),
                              "allgather")):
        on = _time(m, plan, w, c, moe_a2a_overlap=True, moe_dispatcher=dispatcher)
        off = _time(m, plan, w, c, moe_dispatcher=dispatcher)
        assert on.ep_comm_s[0] == off.ep_comm_s[0] > 0
    accepted = _plan(pp=4, vp=4, dp=64, ep=64, last_stage_layers=13)
    assert (_time(m, accepted, w, c, moe_a2a_overlap=True).ep_comm_s[0]
            < _time(m, accepted, w, c).ep_comm_s[0])


def test_fused_dispatcher_sends_one_copy_per_remote_node():
    # EP 32 over four 8-GPU nodes, top-8 of 256 experts: the alltoall dispatcher
    # sends 8 x 24/32 = 6 copies of a token over the network, DeepEP one per distinct
    # remote node, 3 x (1 - C(192,8)/C(256,8)) = 2.71.
    m, w, c = get_model("deepseek-v3"), Workload(4096, 4096, "fp8"), _cluster("b200", 256, 8)
    plan = _plan(pp=8, vp=2, dp=32, ep=32, last_stage_layers=5)
    a2a = _time(m, plan, w, c, moe_dispatcher="alltoall").ep_comm_s[0]
    fused = _time(m, plan, w, c, moe_dispatcher="flex-deepep").ep_comm_s[0]
    miss = np.prod([(192 - i) / (256 - i) for i in range(8)])
    assert fused / a2a == pytest.approx(3 * (1 - miss) / 6, rel=0.02)
    # inside one NVLink domain nothing crosses the network: the two agree
    inside = _plan(dp=8, ep=8)
    q, wq, c8 = get_model("qwen3-30b-a3b"), Workload(512, 4096), _cluster("b200", 8, 8)
    assert (_time(q, inside, wq, c8, moe_dispatcher="flex-hybridep").ep_comm_s[0]
            == _time(q, inside, wq, c8, moe_dispatcher="alltoall").ep_comm_s[0])


def test_mlp_recompute_module_leaves_moe_layers_alone():
    # megatron-core: "mlp" recomputes a dense layer's MLP only; an MoE layer needs "moe".
    m, w, c = get_model("qwen3-30b-a3b"), Workload(512, 4096), _cluster(gpus=8)
    plans = {mods: _plan(ep=8, recompute="selective", recompute_modules=mods)
             for mods in ("core_attn", "mlp", "moe")}
    times = {k: _time(m, p, w, c).step_time_s[0] for k, p in plans.items()}
    acts = {k: _one(m, p, w).activations_bytes[0] for k, p in plans.items()}
    assert times["mlp"] == times["core_attn"] < times["moe"]
    assert acts["mlp"] == acts["core_attn"] > acts["moe"]


def test_allgather_dispatcher_moves_every_token_of_the_group():
    m, w, c = get_model("qwen3-30b-a3b"), Workload(512, 4096), _cluster(gpus=8)
    a2a = _time(m, _plan(ep=8), w, c, moe_dispatcher="alltoall")
    gathered = _time(m, _plan(ep=8), w, c, moe_dispatcher="allgather")
    assert gathered.ep_comm_s[0] > a2a.ep_comm_s[0]


# ---------------------------------------------------------------- CLI

def test_estimate_of_the_deepseek_v3_recipe_fits(capsys):
    code, out, err = run_cli(
        ["estimate", "--model", "deepseek-v3", "--gpu", "gb200", "--gpus", "256", "--tp", "1",
         "--pp", "4", "--vp", "4", "--ep", "64", "--mbs", "1", "--gbs", "4096", "--seq-len",
         "4096", "--precision", "fp8", "--stack", "nemo", "--distributed-optimizer",
         "--recompute", "selective", "--recompute-modules", "mla_up_proj",
         "--moe-dispatcher", "flex-hybridep", "--moe-a2a-overlap", "--format", "json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["fits"] and result["plan"]["last_stage_layers"] == 13
    assert result["time_breakdown_s"]["ep_comm"] >= 0


def test_search_of_an_moe_model_lists_expert_parallel_plans(tmp_path, capsys):
    code, out, err = run_cli(["search", "--model", "mixtral", "--size", "8x7b", "--gpu", "h100",
                              "--nodes", "2", "--gbs", "256", "--seq-len", "4096", "--no-plots",
                              "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert " EP " in out.splitlines()[2] or "EP" in out
    best = json.loads((tmp_path / "best.json").read_text())
    assert best["plan"].get("ep", 1) >= 1
    args = (tmp_path / "megatron_args.sh").read_text()
    assert "--num-experts 8" in args and "--moe-router-topk 2" in args


def test_catalog_lists_active_parameters(capsys):
    code, out, _ = run_cli(["catalog", "models"], capsys)
    line = next(l for l in out.splitlines() if l.startswith("deepseek-v3 "))
    assert "671B" in line and "37.55B" in line and "256 top 8" in line


def test_base_gives_deepseek_v3_its_published_schedule(capsys):
    code, out, _ = run_cli(["base", "--model", "deepseek-v3", "--format", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["optimizer"]["lr"] == pytest.approx(2.2e-4)
    assert doc["optimizer"]["lr_warmup_steps"] == 2000
    assert doc["training"]["tokens"] == pytest.approx(14.8e12)
    assert "2412.19437" in doc["rationale"]["lr"]


def test_infer_spreads_experts_and_caches_mla_latents(tmp_path, capsys):
    code, out, err = run_cli(["infer", "--model", "deepseek-v3", "--gpu", "h200", "--nodes",
                              "2", "--input-len", "1024", "--output-len", "128", "--precision",
                              "fp8", "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    table = json.loads((tmp_path / "infer.json").read_text())
    rows = table["plans"] if isinstance(table, dict) and "plans" in table else table
    assert any(r.get("ep", 1) > 1 for r in rows)
    from autoconfig.inference.memory import kv_bytes_per_token_per_gpu
    m = get_model("deepseek-v3")
    latent = kv_bytes_per_token_per_gpu(m, np.array([8.0]), np.array([1.0]), 1)[0]
    assert latent == 61 * (512 + 64)   # DeepSeek-V2 Table 1: (d_c + d_h^R) per layer


def test_fsdp_stacks_shard_whole_moe_layers_and_refuse_expert_parallelism(capsys):
    m = get_model("deepseek-v3")
    sw = load_stack("pytorch-fsdp").features
    plan = PlanTable.from_plans([Plan(tp=1, pp=1, dp=32, mbs=1, recompute="full",
                                      distributed_optimizer=True)])
    b = memory.memory_breakdown(m, Workload(4096, 4096), plan, software=sw)
    # FULL_SHARD keeps 1/32 of the fp32 master weights and Adam moments (12 B/param) of
    # everything that trains, the MTP module included
    assert b.optimizer_bytes[0] == pytest.approx(12 * total_params(m, with_mtp=True) / 32,
                                                 rel=1e-3)
    # the two gathered units are whole MoE layers (their 256 experts), not dense layers
    assert b.weights_bytes[0] > 2 * 2 * 256 * 3 * 7168 * 2048
    code, _, err = run_cli(["search", "--model", "mixtral", "--size", "8x7b", "--gpu", "h100",
                            "--nodes", "4", "--stack", "pytorch-fsdp", "--ep", "2",
                            "--no-plots"], capsys)
    assert code == 2 and "cannot run ep 2" in err


def test_kimi_k2_published_batch_is_whole_sequences(capsys):
    code, out, _ = run_cli(["base", "--model", "kimi-k2", "--format", "json"], capsys)
    assert json.loads(out)["training"]["global_batch_size"] == 16384


def test_no_valid_plan_names_the_commonest_reason_and_its_fix(capsys, tmp_path):
    code, _, err = run_cli(["search", "--model", "tiny-moe", "--nodes", "1", "--gpus-per-node",
                            "8", "--ep", "3", "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1 and len(err) <= 300
    assert "ep does not divide the experts" in err and "--ep values that divide the 8 experts" in err


def test_expert_kernels_grow_with_local_experts_and_whole_iteration_graphs_hide_launches():
    """Each local expert adds its GEMMs (and FP8 quantisations) at the kernel floor
    plus, outside a whole-iteration CUDA graph, their launches: DeepSeek-V3 at EP 8
    keeps 32 experts a GPU, at EP 32 eight."""
    from autoconfig.training.step_time import expert_kernels_s, load_constants
    c = load_constants()
    eager, graphed = (with_overrides(load_stack("nemo").features, cuda_graph=g)
                      for g in ("none", "full-iteration"))
    mxfp8 = (1.0, 0.0)                        # one cast kernel per expert
    fwd8, bwd8 = expert_kernels_s(c, eager, 8.0, mxfp8)
    fwd32, bwd32 = expert_kernels_s(c, eager, 32.0, mxfp8)
    assert fwd32 + bwd32 == pytest.approx(4.0 * (fwd8 + bwd8))
    per_kernel = c.kernel_gpu_floor_s + c.kernel_launch_host_s
    assert fwd8 + bwd8 == pytest.approx(8 * (6 + 4) * per_kernel)      # 6 GEMMs, 4 casts
    assert sum(expert_kernels_s(c, eager, 8.0)) == pytest.approx(8 * 6 * per_kernel)   # bf16
    assert sum(expert_kernels_s(c, graphed, 8.0, mxfp8)) == pytest.approx(
        8 * 10 * c.kernel_gpu_floor_s)
    assert bwd8 > fwd8 > 0

    m, w, cl = get_model("deepseek-v3"), Workload(4096, 4096, "fp8"), _cluster("b200", 256)
    step = {ep: _time(m, _plan(pp=16, dp=16, ep=ep), w, cl).step_time_s[0] for ep in (8, 16)}
    full = {ep: _time(m, _plan(pp=16, dp=16, ep=ep), w, cl,
                      cuda_graph="full-iteration").step_time_s[0] for ep in (8, 16)}
    assert full[8] < step[8] and full[16] < step[16]
    assert step[8] - full[8] > 1.9 * (step[16] - full[16])    # twice the local experts


def test_expert_quantisation_kernels_follow_the_recipe():
    """Transformer Engine quantises the experts' inputs per recipe: current scaling
    computes each expert's amax and scale before its cast (3 kernels an expert),
    MXFP8 one cast an expert, delayed scaling one fused cast for all; so on the
    same layout current scaling costs the most and the gap grows with the local
    experts, while delayed scaling's does not."""
    from autoconfig.training.fp8 import expert_quantisation_kernels
    from autoconfig.training.step_time import expert_kernels_s, load_constants
    c = load_constants()
    b200, h100 = _cluster("b200", 8).gpu, _cluster("h100-80gb", 8).gpu
    kernels = {r: expert_quantisation_kernels(Workload(4096, 1024, "fp8"),
                                              with_overrides(load_stack("nemo").features,
                                                             fp8_recipe=r), b200)
               for r in ("tensorwise", "mxfp8", "delayed")}
    assert kernels == {"tensorwise": (3.0, 0.0), "mxfp8": (1.0, 0.0), "delayed": (0.0, 1.0)}
    assert expert_quantisation_kernels(Workload(4096, 1024, "bf16"),
                                       load_stack("nemo").features, h100) == (0.0, 0.0)
    eager = with_overrides(load_stack("nemo").features, cuda_graph="none")
    cost = {r: {n: sum(expert_kernels_s(c, eager, n, k)) for n in (4.0, 16.0)}
            for r, k in kernels.items()}
    assert cost["tensorwise"][16.0] > cost["mxfp8"][16.0] > cost["delayed"][16.0]
    gemms_only = sum(expert_kernels_s(c, eager, 16.0)) - sum(expert_kernels_s(c, eager, 4.0))
    assert cost["delayed"][16.0] - cost["delayed"][4.0] == pytest.approx(gemms_only)
    assert cost["tensorwise"][16.0] - cost["tensorwise"][4.0] > 2.0 * gemms_only


def test_recipe_cuda_graph_scope_reaches_the_run():
    from autoconfig.validation.runs import _cuda_graph
    for text, scope in (("cuda_graph=full_iteration;mtp=0", "full-iteration"),
                        ("a=1;cuda_graph=te:attn+moe_router+moe_preprocess", "te-scoped"),
                        ("cuda_graph=none", "none"), ("mtp=0", None)):
        assert _cuda_graph({"recipe_settings": text}) == scope


def test_bad_cuda_graph_is_a_one_line_error():
    with pytest.raises(InputError, match="invalid --cuda-graph 'all'.*none, te-scoped"):
        with_overrides(load_stack("nemo").features, cuda_graph="all")


def test_alltoall_dispatcher_regroups_copies_only_with_several_local_experts():
    """megatron-core's alltoall dispatcher sorts the received copies by local
    expert and back (two copies of every routed token); HybridEP writes them in
    place, and with one expert a rank there is nothing to sort."""
    from autoconfig.core.catalog import get_gpu as gpu
    from autoconfig.training.step_time import _forward_times, load_constants
    m, w = get_model("qwen3-30b-a3b"), Workload(512, 4096, "fp8")
    c = load_constants()

    def traffic(dispatcher, ep):
        sw = with_overrides(load_stack("nemo").features, moe_dispatcher=dispatcher)
        plans = PlanTable.from_plans([_plan(dp=ep, ep=ep)])
        return float(np.asarray(_forward_times(m, w, plans, gpu("b200"), c, sw, "moe",
                                               cluster=_cluster("b200", 128))["layer"])[0])

    copies_per_gpu = 4096 * m.moe_topk
    sort_s = 2 * 4.0 * m.hidden_size * copies_per_gpu / (
        gpu("b200").hbm_bandwidth_gb_per_s * 1e9 * c.hbm_efficiency)
    assert traffic("alltoall", 8) - traffic("flex-hybridep", 8) == pytest.approx(sort_s, rel=1e-6)
    assert traffic("alltoall", 128) == pytest.approx(traffic("flex-hybridep", 128))


def test_routed_copies_are_cast_at_the_recipes_bytes():
    """Each routed copy and its expert activation are quantised at the FP8 recipe's
    bytes per element (current scaling reads the input twice), as dense inputs are."""
    from autoconfig.training.fp8 import cast_bytes_per_element
    from autoconfig.training.step_time import _routed_copy_bytes
    m = get_model("qwen3-30b-a3b")
    h, f = m.hidden_size, m.moe_ffn_hidden_size
    tensorwise, delayed = (_routed_copy_bytes(m, True, 1, cast_bytes_per_element(r))
                           for r in ("tensorwise", "delayed"))
    assert tensorwise - delayed == pytest.approx(2.0 * (h + f))
    assert _routed_copy_bytes(m, False, 1, 6.0) == _routed_copy_bytes(m, False, 1, 0.0)
