"""Prefill mixed into decode steps or run alone (``Engine.mixed_prefill``): the
schedule of a finite job, the steady state, the engine files, the published
points that say what their engine did, and the CLI flag."""

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.job import Job, run, schedule, timing
from autoconfig.inference.latency import latency
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.published import ask, default_points_path, load_points
from autoconfig.training.step_time import load_constants
from cli_runner import run_cli

MODEL = get_model("llama3-8b")
CLUSTER = Cluster(get_gpu("h100-80gb"), 1, 1)


def _arrive_mid_run():
    """Four requests run their decodes; a fifth arrives (a closed-loop client
    sends it when the first, shorter one finishes) and is prefilled among them."""
    inputs, outputs = np.array([64, 64, 64, 64, 64]), np.array([4, 30, 30, 30, 30])
    return inputs, outputs


def test_a_prefill_that_does_not_mix_holds_the_decodes_back_a_step():
    inputs, outputs = _arrive_mid_run()
    mixed = schedule(inputs, outputs, 4, 64, 1e9, None, False, mixed=True)
    alone = schedule(inputs, outputs, 4, 64, 1e9, None, False, mixed=False)
    # the fifth request's prefill: mixed, the three running requests decode beside it
    second = [i for i in range(len(mixed.steps)) if mixed.prefill_tokens[i] > 0][1]
    assert mixed.decode_seqs[second] == 3 and mixed.logits_rows[second] == 4
    second = [i for i in range(len(alone.steps)) if alone.prefill_tokens[i] > 0][1]
    assert alone.decode_seqs[second] == 0 and alone.logits_rows[second] == 1
    # every request still makes all its tokens; the waiting costs the others a step
    for plan in (mixed, alone):
        assert (plan.finished >= 0).all() and (plan.first_token >= 0).all()
    def finished_after_steps(plan):
        ends = np.cumsum(plan.steps)
        return ends[plan.finished]

    # the three that were decoding finish one step later; the fifth, prefilled
    # last, is not held back by anyone
    assert (finished_after_steps(alone)[1:4] == finished_after_steps(mixed)[1:4] + 1).all()
    assert finished_after_steps(alone)[4] == finished_after_steps(mixed)[4]
    step = 0.01
    t_mixed = timing(mixed, np.full(len(mixed.steps), step), outputs)
    t_alone = timing(alone, np.full(len(alone.steps), step), outputs)
    assert t_alone.tpot_s > t_mixed.tpot_s


def test_the_first_prefill_of_a_job_is_the_same_either_way():
    n = 6
    a = schedule(np.full(n, 100), np.full(n, 10), n, 64, 1e9, None, False, mixed=True)
    b = schedule(np.full(n, 100), np.full(n, 10), n, 64, 1e9, None, False, mixed=False)
    assert a.steps.tolist() == b.steps.tolist()
    assert a.decode_seqs.tolist() == b.decode_seqs.tolist()


def test_a_job_at_a_rate_has_longer_tpot_when_prefills_run_alone():
    vllm = engines.get_engine("vllm")
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 256, 1)])
    w = InferenceWorkload(512, 128)
    job = Job(300, None, 8.0)
    mixed = run(MODEL, w, plans, CLUSTER, load_constants(), vllm, job).iloc[0]
    alone = run(MODEL, w, plans, CLUSTER, load_constants(),
                engines.with_mixed_prefill(vllm, False), job).iloc[0]
    assert alone.tpot_ms > 1.05 * mixed.tpot_ms
    assert alone.tokens_per_s_per_replica <= mixed.tokens_per_s_per_replica * 1.001


def test_steady_state_tpot_counts_the_prompts_forwards_when_they_run_alone():
    sglang = engines.get_engine("sglang")
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, b, 1) for b in (4, 64, 512)])
    w = InferenceWorkload(1024, 128)
    c = load_constants()
    alone = latency(MODEL, w, plans, CLUSTER, c, sglang, "continuous")
    mixed = latency(MODEL, w, plans, CLUSTER, c, engines.with_mixed_prefill(sglang, True),
                    "continuous")
    # a prompt's own forward streams the weights again: it costs most where the
    # decode step is memory-bound (64 in flight: a prompt every 2 steps), little
    # where both are compute-bound (512)
    ratio = alone.tpot_s / mixed.tpot_s
    assert (ratio > 1.0).all() and ratio[1] > 1.05 and ratio[2] < 1.05


def test_every_engine_says_whether_it_mixes_and_why():
    expected = {"vllm": True, "tensorrt-llm": True, "megatron-core": True, "lmdeploy": True,
                "lmdeploy-0.1": False, "sglang": False, "fastertransformer": False,
                "megatron-core-static": False}
    for name in engines.names():
        e = engines.get_engine(name)
        assert e.mixed_prefill is expected[name]
        assert len(e.sources["mixed_prefill"]) > 40


def test_static_engines_refuse_a_mixing_override():
    ft = engines.get_engine("fastertransformer")
    assert engines.with_mixed_prefill(ft, None) is ft and engines.with_mixed_prefill(ft, False) is ft
    with pytest.raises(InputError, match="--mixed-prefill.*static batches"):
        engines.with_mixed_prefill(ft, True)


def test_published_points_of_older_vllm_run_prefill_first():
    points = load_points(default_points_path())
    flagged = points[points["mixed_prefill"].astype(str).str.lower() == "false"]
    assert len(flagged) >= 18 and set(flagged["engine"]) == {"vllm"}
    assert flagged["source_location"].str.contains("prefill-first").all()
    # LMDeploy v0.1.0a1 ran ContextDecode before the decode step (before PR 775 unified
    # them): its points name that release's engine, which does not mix
    old = points[points["engine"] == "lmdeploy-0.1"]
    assert len(old) == 55 and old["source_location"].str.contains("v0.1.0a1").all()
    assert not engines.get_engine("lmdeploy-0.1").mixed_prefill
    row = next(points[points["point_id"] == "J085"].itertuples())
    as_published = ask(row)
    as_v1 = ask(row._replace(mixed_prefill=np.nan))
    assert as_published.tpot_ms > as_v1.tpot_ms


def test_a_bad_mixed_prefill_cell_is_a_one_line_error():
    points = load_points(default_points_path())
    row = next(points[points["point_id"] == "J085"].itertuples())
    with pytest.raises(InputError, match="invalid mixed_prefill 'maybe'"):
        ask(row._replace(mixed_prefill="maybe"))


BASE = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
        "--input-len", "1024", "--output-len", "128", "--no-plots", "--format", "json",
        "--tp", "1", "--pp", "1"]


def test_cli_flag_changes_what_the_engine_does(tmp_path, capsys):
    import json

    out = {}
    for flag in ("--mixed-prefill", "--no-mixed-prefill"):
        code, text, err = run_cli(BASE + ["--engine", "sglang", flag, "--output-dir",
                                          str(tmp_path / flag)], capsys)
        assert code == 0, err
        data = json.loads(text)
        assert data["mixed_prefill"] is (flag == "--mixed-prefill")
        out[flag] = data["plans"][0]
    assert out["--no-mixed-prefill"]["tpot_ms"] > out["--mixed-prefill"]["tpot_ms"]
    code, text, err = run_cli(BASE + ["--engine", "fastertransformer", "--mixed-prefill",
                                      "--output-dir", str(tmp_path / "ft")], capsys)
    assert code != 0 and "invalid --mixed-prefill" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_prefill_that_runs_alone_has_the_whole_token_budget():
    # three clients; the first request ends after 2 tokens and its client sends a
    # 1,500-token prompt while two requests decode, under a 1,000-token budget:
    # mixed, the two decodes take 2 of it; alone, the chunk has all 1,000
    inputs, outputs = np.array([8, 8, 8, 1500]), np.array([2, 50, 50, 5])
    for mixed, chunk in ((True, 998), (False, 1000)):
        plan = schedule(inputs, outputs, 3, 64, 1e9, 1000, True, mixed=mixed)
        later = plan.prefill_tokens[1:][plan.prefill_tokens[1:] > 0]
        assert later[0] == chunk and later.sum() == 1500


def test_a_token_budget_override_reaches_the_schedule_and_the_report(tmp_path, capsys):
    import json

    vllm = engines.get_engine("vllm")
    small = engines.with_max_batched_tokens(vllm, 1024)
    assert small.max_batched_tokens == 1024 and engines.with_max_batched_tokens(vllm, None) is vllm
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 256, 1)])
    w = InferenceWorkload(870, 128)
    job = Job(200)
    wide = run(MODEL, w, plans, CLUSTER, load_constants(), vllm, job).iloc[0]
    narrow = run(MODEL, w, plans, CLUSTER, load_constants(), small, job).iloc[0]
    # all 200 prompts (174,000 tokens) sent at once: a 1,024-token budget prefills
    # them a step at a time, each step streaming the weights again, so the first
    # tokens come later (1.47x; the prompt tokens' own costs are the same in both)
    assert narrow.ttft_ms > 1.4 * wide.ttft_ms
    code, text, err = run_cli(BASE + ["--engine", "vllm", "--max-batched-tokens", "1024",
                                      "--output-dir", str(tmp_path / "v")], capsys)
    assert code == 0, err
    data = json.loads(text)
    assert data["max_batched_tokens"] == 1024
    table = ["table" if a == "json" else a for a in BASE]
    code, text, err = run_cli(table + ["--engine", "vllm", "--max-batched-tokens", "1024",
                                       "--output-dir", str(tmp_path / "t")], capsys)
    assert code == 0, err
    assert "1024 tokens a step at most" in err + text
    for bad, why in (("0", "must be an integer from 1"), ("64", "static batches")):
        engine = "vllm" if bad == "0" else "fastertransformer"
        code, _, err = run_cli(BASE + ["--engine", engine, "--max-batched-tokens", bad,
                                       "--output-dir", str(tmp_path / bad)], capsys)
        assert code != 0 and why in err and len(err.strip().splitlines()) == 1


def test_published_points_carry_the_token_budget_their_source_states():
    points = load_points(default_points_path())
    stated = points[points["max_batched_tokens"].notna()]
    lmdeploy_runs = points[points["engine"] == "lmdeploy-0.1"]    # its scripts' budget
    assert len(lmdeploy_runs) == 55
    assert dict(zip(stated["point_id"], stated["max_batched_tokens"].astype(int))) == {
        "J027": 4096, "J028": 1024, "J029": 16384, "J031": 1024,
        # MLPerf TensorRT-LLM runs: each config's max_num_tokens (engine settings note)
        **{pid: 4096 for pid in ("J001", "J002", "J003", "J004", "J009", "J010", "J013",
                                 "J014")},
        "J005": 8192, "J006": 16384, "J007": 16384, "J008": 8192, "J011": 8192,
        "J012": 16384, "J017": 1536, "J018": 1536, "J019": 256, "J020": 12000,
        "J021": 12000, "J022": 12000, "J023": 9216, "J024": 8192, "J025": 1536,
        "J026": 2560, "J155": 3584, "J156": 12000, "J157": 3584,
        # the TensorRT-LLM rows of the vLLM v0.6.0 blog: its nightly benchmark's build flag
        **{f"J0{n}": 16384 for n in (35, 39, 43, 47, 51, 55, 59, 63, 67, 71, 75, 79)},
        **{pid: 16416 for pid in lmdeploy_runs["point_id"]}}
    for row in stated.itertuples():
        text = row.source_location.replace("_", "-")
        assert str(int(row.max_batched_tokens)) in text and (
            "max-num-batched-tokens" in text or "max-num-tokens" in text
            or "max-context-token-num 4 (x session-len 4104" in text)
