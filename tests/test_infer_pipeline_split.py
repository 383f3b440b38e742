"""How an engine cuts a static batch into pipeline micro-batches
(``Engine.pipeline_split``): FasterTransformer's fixed rule, megatron-core's
threshold, and the planner's choice where the split is a setting."""

import dataclasses

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import CatalogError
from autoconfig.inference import engine as engines
from autoconfig.inference.engine import PipelineSplit
from autoconfig.inference.latency import decode_microbatches, prefill_microbatches
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.search import predict
from engine_files import load_with_field

A100 = Cluster(get_gpu("a100-80gb"), 8, 8)
GPT175 = get_model("gpt3", "175b")
FT = engines.get_engine("fastertransformer")
FT_RULE = PipelineSplit("per_stage", "per_stage", 1024, decode_overlaps_steps=False)


def _counts(split, batch, pp, s_in, prefill_m=None):
    b, p = np.array([float(batch)]), np.array([float(pp)])
    pre = prefill_microbatches(split, b, p, s_in)
    m_p = pre[:, 0] if prefill_m is None else np.array([float(prefill_m)])
    return pre[0].tolist(), decode_microbatches(split, b, p, s_in, m_p)[0].tolist()


@pytest.mark.parametrize("batch, pp, s_in, prefill, decode", [
    (64, 8, 60, 8, 8),        # 8 requests x 60 tokens fit 1,024: one per stage
    (64, 4, 512, 32, 4),      # 16 -> 8 -> 4 -> 2 requests until 2 x 512 <= 1,024
    (4, 8, 60, 1, 1),         # 8 does not divide 4: the batch runs whole
    (6, 4, 1000, 2, 1),       # whole batch, halved once to 3 x 1,000 (odd: stops)
    (64, 1, 4096, 1, 1),      # no pipeline: no split at all
])
def test_fastertransformer_splits_as_getlocalbatchsize(batch, pp, s_in, prefill, decode):
    assert FT.pipeline_split == FT_RULE
    assert _counts(FT_RULE, batch, pp, s_in) == ([prefill], [decode])


def test_megatron_core_cuts_a_decode_step_only_past_the_prefill_threshold():
    rule = engines.get_engine("megatron-core-static").pipeline_split
    assert rule == PipelineSplit("threshold", "chosen", None, decode_overlaps_steps=False)
    # prefill in 4 micro-batches of 16 x 512 tokens: a decode step of 64 tokens runs whole
    assert _counts(rule, 64, 4, 512, prefill_m=4)[1] == [1]
    # one-token prompts in 8 micro-batches of 8: the threshold is 8 tokens, decode cut in 8
    assert _counts(rule, 64, 4, 1, prefill_m=8)[1] == [8]
    assert _counts(rule, 64, 4, 512, prefill_m=1)[1] == [1]     # threshold -1: never cut


def test_a_setting_lets_the_planner_choose_each_phase():
    chosen, decode = _counts(PipelineSplit(), 8, 4, 128)
    assert chosen == decode == [1, 2, 4, 8]


def test_fastertransformer_runs_a_small_batch_through_the_stages_whole():
    """GPT-3 175B, TP 8 PP 8, batch 4: FasterTransformer pipelines nothing, so its
    step is the stages in turn at batch 4, not four overlapped micro-batches."""
    plan = InferencePlanTable.from_plans([InferencePlan(8, 8, 4)])
    workload = InferenceWorkload(60, 20)
    fixed = predict(GPT175, workload, plan, A100, engine=FT).iloc[0]
    free = predict(GPT175, workload, plan, A100,
                   engine=dataclasses.replace(FT, pipeline_split=PipelineSplit())).iloc[0]
    assert fixed.decode_microbatches == fixed.prefill_microbatches == 1
    assert free.decode_microbatches > 1
    assert fixed.tpot_ms >= free.tpot_ms


@pytest.mark.parametrize("value", [
    "{decode: sometimes}",
    "{decode: per_stage, prefill: per_stage}",                       # no token limit
    "{decode: chosen, prefill: chosen, prefill_max_tokens: 1024}",   # a limit it ignores
    "{decode: chosen, prefill: per_stage, prefill_max_tokens: 0}",
    "{decode: chosen, every: 2}",
    "{decode: chosen, decode_overlaps_steps: sometimes}",
    "{decode: whole, prefill: sometimes}",
])
def test_a_malformed_split_in_an_engine_file_is_named(tmp_path, monkeypatch, value):
    with pytest.raises(CatalogError, match="pipeline_split"):
        load_with_field(tmp_path, monkeypatch, "fastertransformer", "pipeline_split", value)


def test_fastertransformer_fills_and_drains_the_pipeline_every_decode_step():
    """Its step loop runs each micro-batch through the stages, then broadcasts the
    new tokens from the last stage before the next step: a batch of 4 over 4
    stages, cut into 4 micro-batches of one, takes 4 + 4 - 1 = 7 stage times of
    one request a token where a batch of 1 takes 4 (an in-flight engine keeping
    the 4 in flight would take 4); a batch of 2, which its rule runs whole, 4
    stage times of two requests."""
    plans = InferencePlanTable.from_plans([InferencePlan(8, 4, b) for b in (1, 2, 4)])
    rows = predict(GPT175, InferenceWorkload(60, 20), plans, A100, engine=FT)
    assert rows.decode_microbatches.tolist() == [1, 1, 4]
    assert FT.step_overhead_s == 0.0
    assert rows.tpot_ms[2] == pytest.approx(rows.tpot_ms[0] * 7 / 4)
    overlapped = predict(GPT175, InferenceWorkload(60, 20), plans, A100,
                         engine=dataclasses.replace(FT, pipeline_split=dataclasses.replace(
                             FT_RULE, decode_overlaps_steps=True)))
    assert overlapped.tpot_ms[2] == pytest.approx(rows.tpot_ms[0])
    assert rows.tpot_ms[1] < rows.tpot_ms[2]


H100 = Cluster(get_gpu("h100-80gb"), 1, 8)
LLAMA70 = get_model("llama3-70b")
MCORE = engines.get_engine("megatron-core")


def test_megatron_core_runs_each_step_whole_through_its_stages():
    """Its dynamic engine passes the whole batch through the stages once a step,
    with no micro-batches: at PP 4 and concurrency C each stage holds all C, so
    the step is that of an engine keeping 4 micro-batches in flight at 4 C, and
    slower than that engine's at C (a stage idles while the others work)."""
    assert MCORE.pipeline_split == PipelineSplit("whole", "whole", None,
                                                 decode_overlaps_steps=False)
    in_flight = dataclasses.replace(MCORE, pipeline_split=PipelineSplit())
    workload = InferenceWorkload(1024, 256)

    def row(engine, concurrency):
        plans = InferencePlanTable.from_plans([InferencePlan(2, 4, concurrency)])
        return predict(LLAMA70, workload, plans, H100, engine=engine,
                       mode="continuous").iloc[0]
    whole, four = row(MCORE, 64), row(in_flight, 256)
    assert whole.tpot_ms == pytest.approx(four.tpot_ms)
    assert whole.decode_microbatches == whole.prefill_microbatches == 1
    assert whole.tpot_ms > 1.5 * row(in_flight, 64).tpot_ms
    # a static batch is never cut either: the stages in turn, once each
    static = predict(LLAMA70, workload, InferencePlanTable.from_plans(
        [InferencePlan(2, 4, 64)]), H100, engine=MCORE, mode="static").iloc[0]
    assert static.decode_microbatches == static.prefill_microbatches == 1


def test_a_job_on_megatron_core_steps_the_whole_batch():
    """The simulated job's step is one pass of all its tokens through the stages:
    that of an engine keeping PP micro-batches in flight at PP times the load
    (each of its micro-batches a PP-th of the step's tokens)."""
    from autoconfig.inference.job import step_seconds
    from autoconfig.training.step_time import load_constants
    in_flight = dataclasses.replace(MCORE, pipeline_split=PipelineSplit())
    one = InferencePlanTable.from_plans([InferencePlan(2, 4, 64)])
    workload, c = InferenceWorkload(1024, 256), load_constants()
    # decode sequences, their context, prompt tokens, prompt context, logits rows
    load = (np.array([64.0]), np.array([1100.0]), np.array([512.0]), np.array([256.0]),
            np.array([65.0]))
    scaled = tuple(v * 4 if i in (0, 2, 4) else v for i, v in enumerate(load))
    whole = step_seconds(LLAMA70, workload, one, H100, c, MCORE, *load)
    assert whole == pytest.approx(step_seconds(LLAMA70, workload, one, H100, c, in_flight,
                                               *scaled))
    assert whole > 1.5 * step_seconds(LLAMA70, workload, one, H100, c, in_flight, *load)
    assert MCORE.pipeline_split.lanes(4.0) == 1.0
    assert in_flight.pipeline_split.lanes(4.0) == 4.0


@pytest.mark.parametrize("pp, says", [(4, True), (1, False)])
def test_the_engine_line_says_when_steps_cross_the_stages_in_turn(capsys, tmp_path, pp, says):
    from cli_runner import run_cli
    code, _, err = run_cli(["infer", "--model", "llama3-70b", "--gpu", "h100-80gb", "--gpus",
                            "8", "--engine", "megatron-core", "--tp", str(8 // pp), "--pp",
                            str(pp), "--concurrency", "64", "--input-len", "1024",
                            "--output-len", "256", "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    engine_line = err.splitlines()[0]
    assert engine_line.startswith("engine: megatron-core")
    assert ("each step crosses them in turn" in engine_line) is says
