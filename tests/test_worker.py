"""Real megatron-core training steps through the profiling worker (CPU + gloo, and CUDA when present).

The loss-agreement test is the one that catches a mis-wired plan: with dropout
off and the same seed and data, plans that differ only in TP, PP, VP, SP,
recompute or the distributed optimizer compute the same function, so their
losses must agree over every iteration (a wrong TP shard, an SP norm grad that
is not all-reduced, a pipeline that pairs sends wrongly, all change them).
"""

import dataclasses
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from autoconfig.core.catalog import get_model  # noqa: E402
from autoconfig.core.model import ModelSpec  # noqa: E402
from autoconfig.core.plan import Plan, Workload  # noqa: E402
from autoconfig.profiling.proxy import cpu_proxy  # noqa: E402
from autoconfig.profiling.spec import ProfileSpec  # noqa: E402
from local_ranks import run_local_processes  # noqa: E402

pytestmark = pytest.mark.slow

LOSS_RTOL = 1e-6
"""Measured agreement is ~2e-8 (fp32 on CPU); a sequence-parallel norm whose grads are
not all-reduced over TP drifts by ~1e-5 after two steps, batched p2p with PP2+VP by ~2e-2."""
JOB_TIMEOUT_S = 240


def _run(plan: Plan, model: ModelSpec | None = None, workload: Workload | None = None,
         timeout_s: float = JOB_TIMEOUT_S, **kwargs):
    spec = ProfileSpec(model=model or get_model("tiny"), workload=workload or Workload(8, 128),
                       plan=plan, device="cpu", warmup_steps=1, timed_steps=2, **kwargs)
    return run_local_processes(spec, plan.num_gpus, timeout_s)


def _assert_ok(result, plan):
    assert result.status == "ok", f"{plan}: {result.error}"
    assert result.plan == plan and result.device == "cpu" and result.world_size == plan.num_gpus
    assert result.step_time_s > 0 and result.tokens_per_s_per_gpu > 0
    assert result.model_tflops_per_gpu > 0 and result.peak_memory_bytes > 0
    assert len(result.iteration_times_s) == 3 and len(result.losses) == 3
    assert result.losses[-1] < result.losses[0]   # the optimizer really stepped


def _assert_same_losses(reference, result, plan):
    for ref, got in zip(reference.losses, result.losses):
        assert got == pytest.approx(ref, rel=LOSS_RTOL), \
            f"{plan}: losses {result.losses} != reference {reference.losses}"


BASELINE = Plan(tp=1, pp=1, dp=1)
SAME_FUNCTION_PLANS = [
    Plan(tp=2, pp=1, dp=1),
    Plan(tp=2, pp=1, dp=1, sp=True),
    Plan(tp=1, pp=1, dp=1, recompute="selective"),
    Plan(tp=1, pp=1, dp=1, recompute="full", recompute_method="block"),
    Plan(tp=1, pp=1, dp=2, distributed_optimizer=True),
    Plan(tp=2, pp=2, dp=1, sp=True, recompute="full", recompute_method="uniform"),
    Plan(tp=1, pp=2, dp=2, vp=2, recompute="selective", distributed_optimizer=True),
]


def test_plans_that_differ_only_in_layout_have_the_same_losses():
    reference = _run(BASELINE)
    _assert_ok(reference, BASELINE)
    for plan in SAME_FUNCTION_PLANS:
        result = _run(plan)
        _assert_ok(result, plan)
        _assert_same_losses(reference, result, plan)


def test_swiglu_gqa_rmsnorm_proxy_runs_with_tp_and_pp_and_agrees():
    """A Llama-style proxy (SwiGLU, grouped-query attention, RMSNorm, RoPE) through cpu_proxy."""
    llama, workload = get_model("llama3-8b"), Workload(16, 4096)
    plans = [Plan(tp=2, pp=1, dp=1, sp=True), Plan(tp=1, pp=2, dp=1, recompute="full")]
    results = []
    for plan in plans:
        model, work = cpu_proxy(llama, plan, workload)
        result = _run(plan, model, work)
        _assert_ok(result, plan)
        assert result.model_name == "llama3-8b-cpu-proxy"
        results.append(result)
    _assert_same_losses(results[0], results[1], plans[1])


def test_impossible_plan_returns_error_with_tail():
    """tp=2 cannot split 3 attention heads: a record with the reason, not a raise or a hang."""
    three_heads = dataclasses.replace(get_model("tiny"), hidden_size=48, num_heads=3,
                                      num_kv_heads=3)
    plan = Plan(tp=2, pp=1, dp=1)
    start = time.monotonic()
    result = _run(plan, three_heads, timeout_s=120)
    assert time.monotonic() - start < 100
    assert result.status == "error" and result.plan == plan and result.step_time_s is None
    assert "Traceback" in result.error or "Error" in result.error
    assert len(result.error.splitlines()) <= 25


def test_run_past_its_time_limit_returns_timeout():
    """A job of 10,000 timed steps cannot finish inside 1 s however fast the ranks
    start (forked ranks finished the two-step job in under a second)."""
    plan = Plan(tp=1, pp=1, dp=2)
    spec = ProfileSpec(model=get_model("tiny"), workload=Workload(8, 128), plan=plan,
                       device="cpu", warmup_steps=1, timed_steps=10_000)
    start = time.monotonic()
    result = run_local_processes(spec, plan.num_gpus, 1.0)
    assert time.monotonic() - start < 30
    assert result.status == "timeout" and result.plan == plan and result.world_size == 2
    assert "1 s" in result.error


MOE_REFERENCE = Plan(tp=1, pp=1, dp=2, ep=2)


@pytest.fixture(scope="module")
def moe_reference():
    """tiny-moe with EP 2 on 2 CPU ranks through the alltoall dispatcher (~6 s)."""
    return _run(MOE_REFERENCE, get_model("tiny-moe"), moe_dispatcher="alltoall")


def _assert_moe_ok(result, plan, dispatcher):
    _assert_ok(result, plan)
    assert result.plan.ep == plan.ep and result.moe_dispatcher == dispatcher
    assert result.model_name == "tiny-moe"


def test_moe_expert_parallel_runs_for_real_and_records_its_dispatcher(moe_reference):
    """EP 2 (alltoall, as the stack asked), and EP 4 where the stack asks for
    DeepEP: CUDA only, so the CPU run uses alltoall and the record says so. The
    experts are drawn by global index, so both start from the same weights."""
    _assert_moe_ok(moe_reference, MOE_REFERENCE, "alltoall")
    assert moe_reference.run_notes == ""
    plan = Plan(tp=1, pp=1, dp=4, ep=4, distributed_optimizer=True)
    result = _run(plan, get_model("tiny-moe"), moe_dispatcher="flex-deepep")
    _assert_moe_ok(result, plan, "alltoall")
    assert "flex-deepep needs CUDA: ran alltoall" in result.run_notes
    _assert_same_losses(moe_reference, result, plan)


def test_moe_allgather_with_tensor_and_expert_tensor_parallel_agrees(moe_reference):
    """TP 2 + SP with EP 2 and ETP 2 through the allgather dispatcher: the same
    function, so the same losses as EP 2 alone."""
    plan = Plan(tp=2, pp=1, dp=2, sp=True, ep=2, etp=2)
    result = _run(plan, get_model("tiny-moe"), moe_dispatcher="allgather")
    _assert_moe_ok(result, plan, "allgather")
    _assert_same_losses(moe_reference, result, plan)


def test_mla_moe_proxy_runs_as_gqa_on_cpu_and_says_so():
    """A DeepSeek-like shape (MLA, shared expert, MTP, grouped GEMM asked) through
    cpu_proxy: MLA and grouped GEMM need TransformerEngine, MTP is not built;
    the run goes ahead and the record names each change."""
    deepseek_like = dataclasses.replace(
        get_model("tiny-moe"), name="mla-moe", hidden_size=256, num_heads=8, num_kv_heads=8,
        ffn_hidden_size=512, attention_kind="mla", q_lora_rank=96, kv_lora_rank=64,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, num_experts=16, moe_topk=4,
        moe_ffn_hidden_size=128, moe_shared_expert_ffn_hidden_size=128, mtp_layers=1)
    plan = Plan(tp=1, pp=1, dp=2, ep=2)
    model, workload = cpu_proxy(deepseek_like, plan, Workload(8, 128))
    assert model.attention_kind == "mla" and model.num_experts == 8
    result = _run(plan, model, workload, moe_dispatcher="alltoall", moe_grouped_gemm=True)
    _assert_ok(result, plan)
    assert result.moe_dispatcher == "alltoall" and result.model_name == "mla-moe-cpu-proxy"
    for words in ("multi-latent attention needs TransformerEngine", "grouped-query attention",
                  "grouped GEMM needs TransformerEngine", "multi-token-prediction"):
        assert words in result.run_notes


@pytest.mark.gpu
def test_cuda_run_records_allocator_peak():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    plan = Plan(tp=1, pp=1, dp=1)
    spec = ProfileSpec(model=get_model("tiny"), workload=Workload(8, 128), plan=plan,
                       device="cuda", warmup_steps=1, timed_steps=2)
    result = run_local_processes(spec, 1, JOB_TIMEOUT_S)
    assert result.status == "ok", result.error
    assert result.device == "cuda" and result.peak_memory_bytes > 0 and result.step_time_s > 0


def test_worker_passes_uneven_stage_splits_that_megatron_core_accepts() -> None:
    """A plan with an uneven split (Llama 3 405B's 126 layers on 16 stages with 4
    virtual stages; a first/last split that is not the embedding-and-loss one)
    builds a megatron-core TransformerConfig; the CPU proxy's few layers run even."""
    pytest.importorskip("megatron.core")
    import torch
    from megatron.core.transformer.transformer_config import TransformerConfig

    from autoconfig.core.plan import Plan
    from autoconfig.profiling.worker import _stage_split
    cases = [(126, Plan(tp=1, pp=16, dp=1, vp=4, first_stage_layers=7, last_stage_layers=7)),
             (96, Plan(tp=1, pp=5, dp=1, first_stage_layers=18, last_stage_layers=18))]
    for layers, plan in cases:
        split = _stage_split(layers, plan)
        assert split
        TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4,
                          pipeline_model_parallel_size=plan.pp, pipeline_dtype=torch.float32,
                          virtual_pipeline_model_parallel_size=plan.vp if plan.vp > 1 else None,
                          **split)
    assert _stage_split(4, cases[0][1]) == {}


def test_banded_attention_and_sinks_run_and_change_what_is_computed():
    """GPT-OSS's features on megatron-core's local attention: a 16-token band every other
    layer computes the same at TP 1 and 2 and not what full attention does; learned sinks
    run too and change it again. (Their offsets are initialised per TP rank's slice from
    the rank's own generator, dot_product_attention.py, so TP 1 and 2 start from other
    sinks and only the band is compared across TP.)"""
    tiny = get_model("tiny")
    banded = dataclasses.replace(tiny, sliding_window=16)
    full = _run(BASELINE, tiny)
    results = []
    for plan in (BASELINE, Plan(tp=2, pp=1, dp=1)):
        result = _run(plan, banded)
        _assert_ok(result, plan)
        results.append(result)
    _assert_same_losses(results[0], results[1], Plan(tp=2, pp=1, dp=1))
    # the band changes the losses far beyond the run-to-run agreement (~2e-8)
    assert results[0].losses[-1] != pytest.approx(full.losses[-1], rel=LOSS_RTOL)
    plan = Plan(tp=2, pp=1, dp=1)
    sinks = _run(plan, dataclasses.replace(banded, attention_sinks=True))
    _assert_ok(sinks, plan)
    assert sinks.losses[-1] != pytest.approx(results[1].losses[-1], rel=LOSS_RTOL)
