"""The light parts of profiling: spec/result JSON round trips and the CPU proxy rule (no torch)."""

import dataclasses
import json
import subprocess
import sys

import pytest

from autoconfig.core.catalog import get_model
from autoconfig.errors import InputError
from autoconfig.core.plan import Plan, Workload
from autoconfig.profiling.proxy import cpu_proxy
from autoconfig.profiling.spec import ProfileResult, ProfileSpec


def test_spec_json_round_trip_keeps_every_field():
    spec = ProfileSpec(model=get_model("llama3-8b"), workload=Workload(512, 8192),
                       plan=Plan(tp=4, pp=2, dp=8, cp=2, vp=2, sp=True, mbs=2, recompute="full",
                                 recompute_method="block", recompute_num_layers=3,
                                 distributed_optimizer=True),
                       device="cuda", warmup_steps=1, timed_steps=5, seed=7,
                       master_addr="node-1", master_port=20123)
    text = spec.to_json()
    json.loads(text)   # plain JSON for sbatch / subprocess arguments
    assert ProfileSpec.from_json(text) == spec


def test_result_dict_round_trip_survives_json():
    result = ProfileResult(plan=Plan(tp=2, pp=1, dp=2, sp=True), status="ok", device="cpu",
                           world_size=4, step_time_s=0.25, iteration_times_s=(0.4, 0.25, 0.26),
                           tokens_per_s_per_gpu=1024.0, model_tflops_per_gpu=0.001,
                           peak_memory_bytes=400_000_000, losses=(6.9, 6.8, 6.7),
                           model_name="tiny")
    assert ProfileResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_failed_result_keeps_plan_and_reason():
    spec = ProfileSpec(model=get_model("tiny"), workload=Workload(8, 128),
                       plan=Plan(tp=2, pp=2, dp=1), device="cpu")
    failed = ProfileResult.failed(spec, "timeout", "no result after 5 s")
    assert (failed.plan, failed.status, failed.world_size) == (spec.plan, "timeout", 4)
    assert failed.step_time_s is None and failed.error == "no result after 5 s"


@pytest.mark.parametrize("bad", [{"device": "tpu"}, {"timed_steps": 0}, {"warmup_steps": -1}])
def test_spec_rejects_bad_values(bad):
    kwargs = dict(model=get_model("tiny"), workload=Workload(8, 128), plan=Plan(1, 1, 1),
                  device="cpu")
    with pytest.raises(InputError):
        ProfileSpec(**{**kwargs, **bad})


def test_result_rejects_unknown_status():
    with pytest.raises(InputError, match="status"):
        ProfileResult(plan=Plan(1, 1, 1), status="fine", device="cpu", world_size=1,
                      step_time_s=None, iteration_times_s=(), tokens_per_s_per_gpu=None,
                      model_tflops_per_gpu=None, peak_memory_bytes=None, losses=())


PLANS = [Plan(tp=tp, pp=pp, dp=dp, cp=cp, vp=vp, sp=tp > 1, mbs=mbs)
         for tp in (1, 2, 4, 8) for pp in (1, 2, 4) for dp in (1, 2) for cp in (1, 2)
         for vp in (1, 2) for mbs in (1, 2)]


@pytest.mark.parametrize("name", ["tiny", "gpt3-175b", "llama3-70b", "llama3-8b"])
def test_proxy_keeps_every_plan_valid_and_small(name):
    model, workload = get_model(name), Workload(1536, 2048)
    for plan in PLANS:
        proxy, work = cpu_proxy(model, plan, workload)
        assert proxy.num_layers % (plan.pp * plan.vp) == 0
        assert proxy.num_heads % plan.tp == 0 and proxy.num_kv_heads % plan.tp == 0
        assert proxy.num_heads % proxy.num_kv_heads == 0
        assert (proxy.num_kv_heads < proxy.num_heads) == (model.num_kv_heads < model.num_heads)
        assert proxy.ffn_hidden_size % plan.tp == 0 and proxy.vocab_size % plan.tp == 0
        assert work.seq_len % (2 * plan.cp) == 0 if plan.cp > 1 else work.seq_len <= 128
        microbatches, rest = divmod(work.global_batch_size, plan.mbs * plan.dp)
        assert rest == 0 and microbatches >= plan.pp
        if plan.vp > 1:
            assert microbatches % plan.pp == 0
        assert proxy.hidden_size <= 128 or plan.tp > 4
        assert proxy.num_layers <= 8 and proxy.vocab_size <= 1024 and work.seq_len <= 128
        assert (proxy.mlp_kind, proxy.norm_kind, proxy.position_embedding) == \
            (model.mlp_kind, model.norm_kind, model.position_embedding)
        assert proxy.name.endswith("-cpu-proxy")


def test_proxy_of_plans_differing_only_in_tp_pp_sp_recompute_is_the_same_model():
    """Same proxy shape and batch, so their losses are comparable."""
    tiny, workload = get_model("tiny"), Workload(8, 128)
    plans = [Plan(1, 1, 4), Plan(2, 1, 2), Plan(2, 1, 2, sp=True), Plan(1, 2, 2),
             Plan(2, 2, 1, sp=True, recompute="full"), Plan(4, 1, 1, recompute="selective"),
             Plan(1, 1, 4, distributed_optimizer=True)]
    shapes = {cpu_proxy(tiny, plan, workload)[0] for plan in plans}
    assert len(shapes) == 1
    (shape,) = shapes
    assert (shape.num_layers, shape.hidden_size, shape.num_heads, shape.vocab_size) == \
        (tiny.num_layers, tiny.hidden_size, tiny.num_heads, tiny.vocab_size)


MOE_PLANS = [Plan(tp=tp, pp=pp, dp=dp, sp=tp > 1, ep=ep, etp=etp)
             for tp in (1, 2, 4) for pp in (1, 2, 4) for dp in (1, 2, 4) for ep in (1, 2, 4, 16)
             for etp in (1, 2) if (tp * dp) % (ep * etp) == 0]


def _deepseek_like():
    """DeepSeek-V3's MoE and MLA shape (arXiv 2412.19437), fewer layers."""
    return dataclasses.replace(
        get_model("tiny-moe"), name="deepseek-like", num_layers=61, hidden_size=7168,
        num_heads=128, num_kv_heads=128, ffn_hidden_size=18432, vocab_size=129280,
        attention_kind="mla", q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
        qk_rope_head_dim=64, v_head_dim=128, num_experts=256, moe_topk=8,
        moe_ffn_hidden_size=2048, moe_shared_expert_ffn_hidden_size=2048,
        moe_first_dense_layers=3, mtp_layers=1)


@pytest.mark.parametrize("model", [get_model("tiny-moe"), _deepseek_like()], ids=lambda m: m.name)
def test_moe_proxy_stays_moe_and_fits_every_expert_layout(model):
    workload = Workload(64, 4096)
    for plan in MOE_PLANS:
        proxy, _ = cpu_proxy(model, plan, workload)
        assert proxy.is_moe and proxy.num_experts % plan.ep == 0 and proxy.num_experts <= 16
        assert 1 <= proxy.moe_topk <= proxy.num_experts
        assert proxy.moe_ffn_hidden_size % plan.etp == 0 and proxy.moe_ffn_hidden_size <= 128
        assert bool(proxy.moe_shared_expert_ffn_hidden_size) == \
            bool(model.moe_shared_expert_ffn_hidden_size)
        assert proxy.moe_shared_expert_ffn_hidden_size % plan.tp == 0
        assert "dense" in proxy.layer_pattern and "moe" in proxy.layer_pattern
        assert proxy.attention_kind == model.attention_kind and proxy.kv_channels == 0
        assert proxy.mtp_layers == model.mtp_layers
    # tiny-moe's proxy is tiny-moe itself, whatever the expert layout
    tiny = get_model("tiny-moe")
    shapes = {cpu_proxy(tiny, plan, Workload(16, 128))[0] for plan in MOE_PLANS if plan.ep in (1, 2, 4) and plan.pp == 1}
    assert len(shapes) == 1
    assert dataclasses.replace(shapes.pop(), name="tiny-moe") == tiny


def test_run_choices_name_what_a_cpu_run_changes():
    """Pure: which dispatcher runs and the record's notes, no torch."""
    from autoconfig.profiling.worker import (LOCAL_LAYERS_NOTE, _has_transformer_engine,
                                             run_choices)

    def choices(model, **kwargs):
        return run_choices(ProfileSpec(model=model, workload=Workload(8, 128),
                                       plan=Plan(1, 1, 2, ep=2), **kwargs))

    # a GPU without TransformerEngine runs megatron-core's local layers, and says so
    local = [] if _has_transformer_engine() else [LOCAL_LAYERS_NOTE]
    tiny_moe = get_model("tiny-moe")
    assert choices(get_model("tiny"), device="cpu") == ("", [])
    assert choices(get_model("tiny"), device="cuda") == ("", local)
    for dispatcher in ("alltoall", "allgather"):
        assert choices(tiny_moe, device="cpu", moe_dispatcher=dispatcher) == (dispatcher, [])
        assert choices(tiny_moe, device="cuda", moe_dispatcher=dispatcher) == (dispatcher, local)
    for flex in ("flex-deepep", "flex-hybridep"):
        assert choices(tiny_moe, device="cuda", moe_dispatcher=flex) == (flex, local)
        used, notes = run_choices(ProfileSpec(model=tiny_moe, workload=Workload(8, 128),
                                              plan=Plan(1, 1, 2), device="cuda",
                                              moe_dispatcher=flex))
        assert used == "alltoall" and "needs TP x EP > 1" in notes[0]
        used, notes = choices(tiny_moe, device="cpu", moe_dispatcher=flex)
        assert used == "alltoall" and notes == [f"MoE dispatcher {flex} needs CUDA: ran "
                                                "alltoall on CPU"]
    used, notes = choices(_deepseek_like(), device="cpu", moe_dispatcher="allgather",
                          moe_grouped_gemm=True)
    assert used == "allgather" and len(notes) == 3
    assert "grouped GEMM" in notes[0] and "grouped-query attention" in notes[1]
    assert "multi-token-prediction" in notes[2]
    with pytest.raises(InputError, match="MoE dispatcher"):
        ProfileSpec(model=tiny_moe, workload=Workload(8, 128), plan=Plan(1, 1, 1), device="cpu",
                    moe_dispatcher="deepep")


def test_result_records_carry_the_dispatcher_and_notes():
    from autoconfig.profiling.store import result_record

    result = ProfileResult(plan=Plan(tp=1, pp=1, dp=2, ep=2), status="ok", device="cpu",
                           world_size=2, step_time_s=0.2, iteration_times_s=(0.3, 0.2),
                           tokens_per_s_per_gpu=1.0, model_tflops_per_gpu=0.1,
                           peak_memory_bytes=1, losses=(7.0, 6.9), model_name="tiny-moe",
                           moe_dispatcher="alltoall", run_notes="x", peak_allocated_bytes=1)
    assert ProfileResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    # a record written before the allocated peak was kept still loads
    old = {k: v for k, v in result.to_dict().items() if k != "peak_allocated_bytes"}
    assert ProfileResult.from_dict(old).peak_allocated_bytes is None
    record = result_record(result)
    assert (record["ep"], record["moe_dispatcher"], record["run_notes"]) == (2, "alltoall", "x")


def test_light_modules_do_not_import_torch():
    code = ("import sys, autoconfig.profiling, autoconfig.profiling.spec, "
            "autoconfig.profiling.proxy, autoconfig.profiling.worker, "
            "autoconfig.profiling.cpu_bridge; "
            "print('torch' in sys.modules, 'megatron' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
