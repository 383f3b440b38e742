"""Encoder-decoder (T5) profiling: real megatron-core T5Model training steps on CPU.

The worker on tiny-t5 (2 encoder + 2 decoder layers) for plans that together
use every axis T5 allows (TP with and without SP, DP, micro-batches with
gradient accumulation, full uniform/block and selective recompute, the
distributed optimizer); the axes it does not (PP, CP, EP) as one-line failed
records; then ``autoconfig search --profile`` end to end through the local
executor and through a real local SLURM.
"""

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from autoconfig.core.catalog import get_model
from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Plan, Workload
from autoconfig.profiling import store
from autoconfig.profiling.proxy import cpu_proxy
from autoconfig.profiling.spec import ProfileSpec
from tests.cli_runner import cli

ROOT = Path(__file__).resolve().parent.parent
TINY_T5 = ROOT / "configs" / "models" / "tiny-t5.yaml"
WORKLOAD = Workload(global_batch_size=8, seq_len=64)
"""8 samples of tiny-t5's 64 encoder tokens: DP 2 x micro-batch 2 accumulates 2 micro-batches."""
LOSS_RTOL = 1e-6
"""The plans below compute the same function (dropout 0, same weights and data);
measured agreement is ~1e-8 in fp32."""
JOB_TIMEOUT_S = 240

AXIS_PLANS = [
    Plan(tp=2, pp=1, dp=1, sp=True, recompute="full", recompute_method="uniform"),
    Plan(tp=2, pp=1, dp=1, recompute="selective"),
    Plan(tp=1, pp=1, dp=2, mbs=2, recompute="full", recompute_method="block",
         recompute_num_layers=1, distributed_optimizer=True),
]


def _needs_megatron():
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")


def _run(plan: Plan, model: ModelSpec | None = None):
    from local_ranks import run_local_processes

    spec = ProfileSpec(model=model or get_model("tiny-t5"), workload=WORKLOAD, plan=plan,
                       device="cpu", warmup_steps=1, timed_steps=2)
    return run_local_processes(spec, plan.num_gpus, JOB_TIMEOUT_S)


def _assert_measured(result, plan):
    assert result.status == "ok", f"{plan}: {result.error}"
    assert result.plan == plan and result.device == "cpu" and result.world_size == plan.num_gpus
    assert result.step_time_s > 0 and result.peak_memory_bytes > 0
    assert result.model_tflops_per_gpu > 0
    # Throughput counts encoder tokens (samples x seq_len), as NeMo counts T5's.
    assert result.tokens_per_s_per_gpu == pytest.approx(
        WORKLOAD.global_batch_size * WORKLOAD.seq_len / result.step_time_s / plan.num_gpus)
    assert len(result.iteration_times_s) == 3 and len(result.losses) == 3
    assert result.losses[-1] < result.losses[0]   # the optimizer really stepped


@pytest.fixture(scope="module")
def axis_results():
    _needs_megatron()
    return [_run(plan) for plan in AXIS_PLANS]


@pytest.mark.slow
def test_every_t5_axis_runs_real_steps_and_is_measured(axis_results):
    for plan, result in zip(AXIS_PLANS, axis_results):
        _assert_measured(result, plan)
        assert result.model_name == "tiny-t5" and result.run_notes == ""


@pytest.mark.slow
def test_t5_layouts_compute_the_same_function(axis_results):
    """TP/SP shards, DP slices, micro-batches and recompute change how, not what:
    a wrongly sharded cross-attention or an SP norm grad not all-reduced would
    change the losses."""
    reference = axis_results[0]
    for plan, result in zip(AXIS_PLANS[1:], axis_results[1:]):
        for ref, got in zip(reference.losses, result.losses):
            assert got == pytest.approx(ref, rel=LOSS_RTOL), \
                f"{plan}: losses {result.losses} != {reference.losses}"


@pytest.mark.slow
def test_t5_variants_run_and_relative_bias_is_noted_on_cpu():
    """ReGLU, RMSNorm, no biases, an untied output layer and a head width apart
    from hidden/heads (one rank: the axes are covered above); the relative position
    bias needs TransformerEngine's attention, so the CPU run uses learned
    positions and its record says so."""
    _needs_megatron()
    model = dataclasses.replace(get_model("tiny-t5"), mlp_kind="reglu", norm_kind="rmsnorm",
                                has_bias=False, tied_embeddings=False, kv_channels=32,
                                position_embedding="relative")
    plan = Plan(tp=1, pp=1, dp=1)
    result = _run(plan, model)
    _assert_measured(result, plan)
    assert "relative position bias needs TransformerEngine" in result.run_notes
    assert "learned absolute positions" in result.run_notes


@pytest.mark.parametrize("plan, words", [
    (Plan(tp=1, pp=2, dp=1), "invalid pp 2"),
    (Plan(tp=1, pp=1, dp=1, cp=2), "invalid cp 2"),
    (Plan(tp=1, pp=1, dp=2, ep=2), "invalid ep 2"),
])
def test_axes_t5_cannot_run_are_one_line_failed_records(plan, words):
    from autoconfig.profiling.worker import run_task

    spec = ProfileSpec(model=get_model("tiny-t5"), workload=WORKLOAD, plan=plan, device="cpu")
    result = run_task(spec)
    assert result.status == "error" and result.plan == plan and result.step_time_s is None
    assert words in result.error and "'tiny-t5'" in result.error
    assert "\n" not in result.error and "Traceback" not in result.error


@pytest.mark.slow
def test_refused_plan_comes_back_from_every_rank_without_a_rendezvous():
    """Through real rank processes: each refuses at once, none waits for a peer."""
    _needs_megatron()
    plan = Plan(tp=2, pp=2, dp=1)
    result = _run(plan)
    assert result.status == "error" and result.world_size == 4
    assert result.error.startswith("invalid pp 2 for encoder-decoder model 'tiny-t5'")
    assert "Pipeline parallelism is not supported for T5" in result.error


def test_proxy_keeps_an_encoder_decoder_model_encoder_decoder():
    # T5-base's shape: 12 + 12 layers, 512 encoder / 128 decoder tokens
    t5 = dataclasses.replace(get_model("tiny-t5"), name="t5-like", num_layers=24,
                             decoder_layers=12, seq_len=512, decoder_seq_len=128)
    model, work = cpu_proxy(t5, Plan(tp=1, pp=1, dp=1), Workload(2048, 512))
    assert model.is_encoder_decoder and (model.encoder_layers, model.decoder_layers) == (2, 2)
    assert (model.seq_len, model.decoder_seq_len) == (128, 32)    # the 4:1 ratio kept
    assert work.seq_len == model.seq_len and model.mlp_kind == "geglu"
    # With SP the decoder's sequence is split over TP too: a multiple of tp.
    model, _ = cpu_proxy(t5, Plan(tp=4, pp=1, dp=1, sp=True), Workload(2048, 60))
    assert model.decoder_seq_len % 4 == 0 and model.decoder_seq_len <= model.seq_len
    # A workload sequence shorter than the decoder's: the decoder's is capped at it.
    model, _ = cpu_proxy(t5, Plan(tp=1, pp=1, dp=1), Workload(8, 100))
    assert model.decoder_seq_len == model.seq_len == 100
    # A decoder-only model stays decoder-only.
    assert not cpu_proxy(get_model("tiny"), Plan(tp=1, pp=1, dp=1),
                         Workload(8, 128))[0].is_encoder_decoder


# ---------------------------------------------------------------- the CLI, end to end

SEARCH_ARGS = ("search", "--model", TINY_T5, "--gpus", "4", "--gpus-per-node", "4",
               "--gpu", "h100", "--gbs", "8", "--mbs", "1", "--profile", "--device", "cpu",
               "--max-steps", "2", "--warmup-steps", "1", "--max-minutes", "5", "--no-plots")


def _search(out: Path, executor: str, top_k: int):
    _needs_megatron()
    proc = cli(*SEARCH_ARGS, "--executor", executor, "--top-k", str(top_k), "-o", out,
               timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "profile", proc.stdout


def _assert_t5_records(results: Path, executor: str, count: int):
    records = store.load_records(results)
    assert len(records) == count
    model = get_model("tiny-t5")
    for record in records:
        assert record["status"] == "ok", record.get("error")
        assert record["executor"] == executor and record["device"] == "cpu"
        assert record["world_size"] == 4 and record["model_name"] == "tiny-t5-cpu-proxy"
        assert (record["pp"], record["cp"], record["ep"], record["vp"]) == (1, 1, 1, 1)
        assert record["step_time_s"] > 0 and record["peak_memory_bytes"] > 0
        assert len(record["losses"]) == 3 and record["losses"][-1] < record["losses"][0]
        # encoder tokens of the proxy's batch per step, per rank
        _, work = cpu_proxy(model, store.plan_from_record(record), Workload(8, model.seq_len))
        assert record["tokens_per_s_per_gpu"] == pytest.approx(
            work.tokens_per_step / record["step_time_s"] / 4)
    meta = json.loads((results / store.META_FILE).read_text())
    assert meta["model_name"] == "tiny-t5"
    shapes = list(meta["run_shapes"].values())
    assert shapes and all(s["decoder_layers"] == 2 and s["decoder_seq_len"] == 16 for s in shapes)
    return records


@pytest.fixture(scope="module")
def local_search(tmp_path_factory):
    return _search(tmp_path_factory.mktemp("tiny-t5-search"), "local", top_k=2)


@pytest.mark.slow
def test_t5_search_profiles_and_reports_through_the_local_executor(local_search):
    results, text = local_search
    assert "Measured ranking" in text and "not gpu figures" in text.lower()
    records = _assert_t5_records(results, "local", 2)
    report = pd.read_csv(results / "profile_report.csv")
    assert sorted(report["measured_rank"]) == [1, 2]
    best = report[report["measured_rank"] == 1].iloc[0]
    assert best["tokens_per_s_per_gpu"] == max(r["tokens_per_s_per_gpu"] for r in records)
    assert "tiny-t5-cpu-proxy" in (results / "profile_report.md").read_text()


@pytest.mark.slow
def test_t5_search_profiles_through_a_real_slurm(slurm, tmp_path):
    results, text = _search(tmp_path / "out", "slurm", top_k=1)
    assert "Measured ranking" in text
    _assert_t5_records(results, "slurm", 1)
    assert (results / "profile_report.md").exists()
