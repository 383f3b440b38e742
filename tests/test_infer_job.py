"""Finite serving jobs (``infer --num-requests``): spread lengths, the engine's
step-by-step schedule, the drain of an offline run, closed-loop clients,
arrivals at a request rate, KV-limited admission and preemption, through the
library and the real CLI."""

import dataclasses
import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.datasets import get_dataset, names
from autoconfig.inference.job import Job, run, schedule, timing
from autoconfig.inference.lengths import arrival_times_s, request_lengths
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.published import ask, load_points, default_points_path
from autoconfig.inference.search import Pins, search
from autoconfig.training.step_time import load_constants
from cli_runner import run_cli

MODEL = get_model("llama3-8b")
CLUSTER = Cluster(get_gpu("h100-80gb"), 1, 1)
VLLM = engines.get_engine("vllm")
BASE = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
        "--engine", "vllm", "--no-plots"]


def one_plan(cap: int) -> InferencePlanTable:
    return InferencePlanTable.from_plans([InferencePlan(1, 1, cap, 1)])


def job_row(workload, job, cap=256, engine=VLLM):
    return run(MODEL, workload, one_plan(cap), CLUSTER, load_constants(), engine, job).iloc[0]


def test_lengths_keep_the_mean_spread_and_order() -> None:
    a = request_lengths(179, 188, 500, seed=2)
    assert a.dtype.kind == "i" and len(a) == 500 and a.min() >= 1
    assert abs(a.mean() - 179) < 1.0 and 150 < a.std() < 220
    assert (a == request_lengths(179, 188, 500, seed=2)).all()          # deterministic
    assert not (a == np.sort(a)).all()                                  # shuffled
    assert (request_lengths(256, 0, 10, seed=1) == 256).all()
    with pytest.raises(InputError, match="spread"):
        request_lengths(10, -1, 5, seed=0)


def test_uniform_lengths_spread_evenly_with_no_tail() -> None:
    # sglang.bench_serving --dataset-name random --random-input 1024 --random-range-ratio 0:
    # prompts uniform over 1..1024, mean 512.5, sd (1024^2 - 1)^0.5 / 12^0.5 = 295.6
    u = request_lengths(512.5, 295.6, 3000, seed=1, dist="uniform")
    g = request_lengths(512.5, 295.6, 3000, seed=1)
    assert abs(u.mean() - 512.5) < 1.0 and abs(u.std() - 295.6) < 2.0
    assert 1 <= u.min() <= 3 and 1021 <= u.max() <= 1025        # the range, nothing beyond
    assert np.histogram(u, bins=4, range=(0, 1024))[0].min() > 700   # flat, not peaked
    assert g.max() > 1.3 * u.max()                              # the gamma's tail
    assert (u == request_lengths(512.5, 295.6, 3000, seed=1, dist="uniform")).all()
    with pytest.raises(InputError, match="--length-dist 'normal'"):
        request_lengths(512.5, 295.6, 10, seed=1, dist="normal")


def test_uniform_lengths_drain_sooner_than_gamma_ones_of_the_same_spread() -> None:
    workload = InferenceWorkload(512, 512, "bf16", 296, 296)
    gamma = job_row(workload, Job(1000))
    uniform = job_row(dataclasses.replace(workload, length_dist="uniform"), Job(1000))
    # the same tokens, but the longest request is 1,025 tokens long, not ~2,000
    assert uniform.duration_s < 0.97 * gamma.duration_s
    assert uniform.tokens_per_s_per_replica > gamma.tokens_per_s_per_replica


def test_fixed_lengths_all_at_once_run_as_one_batch() -> None:
    n, s_in, s_out = 8, 100, 20
    plan = schedule(np.full(n, s_in), np.full(n, s_out), n, 64, 1e9, None, False)
    assert plan.steps.sum() == s_out                         # prefill step + 19 decodes
    assert (plan.first_token == 0).all() and (plan.finished == plan.finished[0]).all()
    assert plan.prefill_tokens[0] == n * s_in and plan.decode_seqs[-1] == n
    t = timing(plan, np.full(len(plan.steps), 0.01), np.full(n, s_out))
    assert t.duration_s == pytest.approx(0.2) and t.ttft_s == pytest.approx(0.01)
    assert t.tpot_s == pytest.approx(0.01)


def test_a_token_budget_chunks_prompts_and_delays_first_tokens() -> None:
    plan = schedule(np.full(4, 1000), np.full(4, 5), 4, 64, 1e9, 1500, True)
    assert plan.prefill_tokens.max() <= 1500
    assert len(set(plan.first_token)) > 1                    # not all prompts in one step


def test_spread_outputs_drain_slower_than_fixed_ones_of_the_same_mean() -> None:
    fixed = job_row(InferenceWorkload(202, 179), Job(500))
    spread = job_row(InferenceWorkload(202, 179, "bf16", 222, 188), Job(500))
    # the longest requests run on alone at the end: the job lasts longer
    assert spread.duration_s > 1.3 * fixed.duration_s
    assert spread.tokens_per_s_per_replica < fixed.tokens_per_s_per_replica


def test_more_clients_than_slots_queue_in_ttft() -> None:
    w = InferenceWorkload(256, 128)
    slots = job_row(w, Job(400, 32), cap=32)
    queued = job_row(w, Job(400, 128), cap=32)
    assert queued.ttft_ms > 2 * slots.ttft_ms
    assert queued.tokens_per_s_per_replica == pytest.approx(slots.tokens_per_s_per_replica,
                                                            rel=0.1)


def test_kv_admission_reserving_never_overflows_and_preemption_recomputes() -> None:
    inputs, outputs = np.full(20, 100), np.full(20, 100)
    reserve = schedule(inputs, outputs, 20, 20, 1000.0, None, False, reserve_output=True)
    assert reserve.peak_kv_tokens <= 1000
    assert reserve.decode_seqs.max() <= 5                    # 1000 / (100 + 100)
    grow = schedule(inputs, outputs, 20, 20, 1000.0, None, False, reserve_output=False)
    assert (grow.finished >= 0).all() and (grow.first_token >= 0).all()
    assert grow.peak_kv_tokens <= 1000 + 20                  # preempted back under the pool
    # recomputation prefills more prompt tokens than the prompts themselves
    assert grow.prefill_tokens.sum() > inputs.sum()


def test_search_with_a_job_scores_each_layout_on_its_run() -> None:
    w = InferenceWorkload(202, 179, "bf16", 222, 188)
    result = search(get_model("llama3-70b"), w, Cluster(get_gpu("h100-80gb"), 1, 8),
                    engine=VLLM, job=Job(1000))
    t = result.table
    assert result.job == Job(1000) and "job_duration_s" in t.columns
    assert (t["batch"] == VLLM.max_num_seqs).all()
    tokens = 1000 * 179
    # throughput is the job's output tokens over its duration, replicas sharing the job
    per_replica = t["tokens_per_s_per_replica"] * t["job_duration_s"]
    assert np.allclose(per_replica, tokens / t["replicas"], rtol=0.02)
    with pytest.raises(InputError, match="--num-requests"):
        search(MODEL, w, CLUSTER, engine=VLLM, job=Job(10), pins=Pins(batch=(4,)))
    with pytest.raises(InputError, match="--num-requests"):
        Job(0)


def test_datasets_are_sourced_and_usable() -> None:
    assert {"sharegpt", "mlperf-llama2-70b"} <= set(names())
    share = get_dataset("sharegpt")
    assert share.output_len_std_tokens > 0.9 * share.output_len_tokens    # long-tailed
    with pytest.raises(InputError, match="allowed are"):
        get_dataset("nope")


def test_cli_runs_a_sharegpt_job(capsys, tmp_path) -> None:
    code, out, err = run_cli(BASE + ["--dataset", "sharegpt", "--num-requests", "500",
                                     "--format", "json", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["num_requests"] == 500 and data["clients"] is None
    assert data["input_len_tokens"] == 202 and data["output_len_std_tokens"] == 188
    assert data["plans"][0]["job_duration_s"] > 0
    code, out, err = run_cli(BASE + ["--dataset", "sharegpt", "--num-requests", "300",
                                     "--concurrency", "64", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert "300 requests sent by 64 clients" in out and "job s" in out
    code, out, err = run_cli(BASE + ["--input-len", "512", "--output-len", "512",
                                     "--input-len-std", "296", "--output-len-std", "296",
                                     "--length-dist", "uniform", "--num-requests", "300",
                                     "--format", "json", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert json.loads(out)["length_dist"] == "uniform"


@pytest.mark.parametrize("args,message", [
    (["--input-len", "128"], "--input-len and --output-len"),
    (["--dataset", "sharegpt", "--num-requests", "0"], "--num-requests"),
    (["--dataset", "sharegpt", "--num-requests", "10", "--batch", "4"], "--num-requests"),
    (["--dataset", "sharegpt", "--num-requests", "10", "--concurrency", "4,8"], "one --concurrency"),
    (["--input-len", "128", "--output-len", "16", "--output-len-std", "-3"], "--output-len-std"),
    (["--dataset", "sharegpt", "--num-requests", "10", "--length-dist", "zipf"],
     "--length-dist"),
    (["--dataset", "sharegpt", "--num-requests", "10", "--concurrency", "4", "--request-rate",
      "2"], "not both"),
    (["--dataset", "sharegpt", "--num-requests", "10", "--request-rate", "-1"], "--request-rate"),
])
def test_bad_job_input_is_one_line(capsys, tmp_path, args, message) -> None:
    code, _, err = run_cli(BASE + args + ["-o", str(tmp_path)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_published_offline_points_are_asked_as_jobs() -> None:
    points = load_points(default_points_path())
    row = next(r for r in points.itertuples(index=False) if r.point_id == "J056")
    assert row.num_requests == 500 and row.output_len_std_tokens > 0
    assert row.decode_steps == 10                   # vLLM 0.6.0 --num-scheduler-steps 10
    assert str(row.mixed_prefill).lower() == "false"    # its V0 scheduler: prefill-first
    pred = ask(row)
    w = InferenceWorkload(202, 179, "bf16", row.input_len_std_tokens,
                          row.output_len_std_tokens)
    v0 = engines.with_mixed_prefill(engines.with_decode_steps(VLLM, 10), False)
    direct = search(MODEL, w, CLUSTER, engine=v0, job=Job(500),
                    max_batch=int(row.batch), pins=Pins((1,), (1,))).table.iloc[0]
    assert pred.tokens_per_s_per_gpu == pytest.approx(direct.tokens_per_s_per_gpu)


def test_arrivals_are_a_deterministic_poisson_process() -> None:
    t = arrival_times_s(4.0, 2000, seed=3)
    gaps = np.diff(t)
    assert t[0] == 0.0 and (gaps > 0).all()
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.02)
    assert np.std(gaps) == pytest.approx(0.25, rel=0.05)        # exponential: sd = mean
    assert (t == arrival_times_s(4.0, 2000, seed=3)).all()
    with pytest.raises(InputError, match="--request-rate"):
        arrival_times_s(0.0, 5, seed=3)


def _rate_job(rate: float, n: int = 400):
    w = InferenceWorkload(512, 128, "bf16")
    return job_row(w, Job(n, None, rate))


def test_a_slow_rate_serves_each_request_nearly_alone_and_lasts_as_long_as_its_arrivals() -> None:
    slow = _rate_job(0.1, 40)
    alone = job_row(InferenceWorkload(512, 128, "bf16"), Job(1))
    # Requests 10 s apart on average (one takes about 1.3 s here) rarely meet:
    # each sees the engine about as a single request does.
    assert slow.ttft_ms == pytest.approx(alone.ttft_ms, rel=0.05)
    assert slow.tpot_ms == pytest.approx(alone.tpot_ms, rel=0.05)
    span = 39 / 0.1                                  # last send, in seconds, near 39 gaps
    assert span * 0.8 < slow.duration_s < span * 1.2 + alone.latency_ms / 1e3


def test_load_raises_tpot_and_past_capacity_ttft_grows_like_a_queue() -> None:
    rows = [_rate_job(r) for r in (2.0, 8.0, 32.0, 1e4)]
    tpot = [r.tpot_ms for r in rows]
    assert tpot == sorted(tpot) and tpot[-1] > 2 * tpot[0]
    assert rows[2].ttft_ms < rows[3].ttft_ms               # more waiting, nearer all-at-once
    offline = job_row(InferenceWorkload(512, 128, "bf16"), Job(400))
    assert rows[3].tokens_per_s_per_replica == pytest.approx(
        offline.tokens_per_s_per_replica, rel=0.05)
    assert rows[0].tokens_per_s_per_replica < rows[1].tokens_per_s_per_replica


def test_exact_timing_never_starts_a_request_before_it_was_sent() -> None:
    from autoconfig.inference import job as jobs
    captured = {}
    real = jobs.timing

    def spy(plan, step_s, outputs, steady=False, lag_s=None):
        captured["plan"], captured["step_s"] = plan, step_s
        return real(plan, step_s, outputs, steady, lag_s)
    jobs.timing = spy
    try:
        _rate_job(16.0)
    finally:
        jobs.timing = real
    plan, step_s = captured["plan"], captured["step_s"]
    durations = plan.steps * step_s
    ends = jobs.segment_ends(durations, plan.not_before_s)
    starts = ends - durations
    first = plan.first_token
    assert (starts[first] >= plan.sent_at_s[np.arange(len(first))] - 1e-9).all()
    # The schedule's clock was kept on the exact step model: its last arrival
    # is admitted where the exact timeline has reached it, not seconds later.
    last = int(np.argmax(plan.sent_at_s))
    assert ends[first[last]] - plan.sent_at_s[last] < 0.5


def test_cli_runs_a_job_at_a_request_rate(capsys, tmp_path) -> None:
    code, out, err = run_cli(BASE + ["--dataset", "sharegpt", "--num-requests", "200",
                                     "--request-rate", "5", "--format", "json",
                                     "-o", str(tmp_path)], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["job_request_rate_per_s"] == 5 and data["num_requests"] == 200
    assert data["plans"][0]["job_duration_s"] > 199 / 5 * 0.8
    code, out, err = run_cli(BASE + ["--dataset", "sharegpt", "--num-requests", "200",
                                     "--request-rate", "5", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert "200 requests arriving at 5/s (Poisson, spread round-robin over replicas)" in out


def test_published_poisson_runs_are_asked_as_jobs_at_their_rate() -> None:
    points = load_points(default_points_path())
    row = next(r for r in points.itertuples(index=False) if r.point_id == "J092")
    assert row.num_requests == 300 and row.request_rate_per_s == 1.0
    pred = ask(row)
    # 300 requests at 1/s last about 300 s, so the output rate is near the
    # arrival rate times the output length, not the engine's capacity.
    assert pred.tokens_per_s_per_gpu * 8 == pytest.approx(1024.0, rel=0.1)


def test_segment_ends_follow_the_one_after_another_recurrence() -> None:
    from autoconfig.inference.job import segment_ends
    rng = np.random.default_rng(0)
    durations, not_before = rng.uniform(0, 1, 50), np.sort(rng.uniform(0, 30, 50))
    for start in (0.0, 12.0):
        end, expected = start, []
        for d, wait in zip(durations, not_before):
            end = max(end, wait) + d
            expected.append(end)
        assert segment_ends(durations, not_before, start) == pytest.approx(expected)


LMDEPLOY_7B = ["infer", "--model", "llama2", "--size", "7b", "--gpu", "a100-80gb", "--gpus", "1",
               "--engine", "lmdeploy", "--input-len", "2048", "--output-len", "2048",
               "--tp", "1"]


def test_a_static_batch_past_the_kv_pool_runs_as_a_job_the_error_names(capsys, tmp_path) -> None:
    """32 sessions of 2,048 + 2,048 tokens need 64 GiB of KV cache beside the 12.6 GiB
    of Llama 2 7B: more than an A100 80GB holds as one static batch. A paged
    in-flight engine runs it anyway (LMDeploy measured it: docs/en/benchmark/
    a100_fp16.md), so the refusal names the job that predicts it, and that job
    answers with every request served."""
    code, _, err = run_cli(LMDEPLOY_7B + ["--batch", "32", "-o", str(tmp_path)], capsys)
    assert code != 0 and len(err.strip().splitlines()) == 1, err
    assert "--num-requests 32 --max-batch 32" in err
    code, out, err = run_cli(LMDEPLOY_7B + ["--num-requests", "32", "--max-batch", "32",
                                            "--format", "json", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    # the pool holds fewer whole sequences than the batch, so some wait or are preempted
    assert best["batch"] == 32 and best["fits"] and best["job_duration_s"] > 0
    assert best["tokens_per_s_per_gpu"] * best["job_duration_s"] == pytest.approx(32 * 2048,
                                                                                  rel=0.01)


def test_a_contiguous_cache_engine_gets_no_job_hint(capsys, tmp_path) -> None:
    """FasterTransformer allocates the whole batch's sequences up front: a batch that
    does not fit cannot start, so no job is suggested."""
    args = ["infer", "--model", "llama2", "--size", "7b", "--gpu", "a100-80gb", "--gpus", "1",
            "--engine", "fastertransformer", "--input-len", "2048", "--output-len", "2048",
            "--tp", "1", "--batch", "32", "-o", str(tmp_path)]
    code, _, err = run_cli(args, capsys)
    assert code != 0 and "fits in" in err and "--num-requests" not in err, err


def test_published_static_batches_past_the_pool_are_asked_as_jobs() -> None:
    """A static batch of 32 x (2,048 + 2,048) tokens on LMDeploy on one A100 80GB (J107's
    model and lengths, asked as a static batch) is asked the way the refusal tells a
    user to: the same prediction as the job it names."""
    points = load_points(default_points_path())
    row = next(r for r in points.itertuples(index=False) if r.point_id == "J107")
    nan = float("nan")
    row = row._replace(batching="static", batch=32.0, clients=nan, num_requests=nan,
                       mixed_prefill=nan, max_batched_tokens=nan, statistic="mean")
    pred = ask(row)
    model, gpu = get_model("llama2-7b"), get_gpu("a100-80gb")
    engine = engines.with_kv_cache_tokens(engines.get_engine(row.engine),
                                          int(row.kv_cache_tokens))
    assert 32 * (2048 + 2048) > engine.kv_cache_tokens      # the batch outgrows the pool
    direct = search(model, InferenceWorkload(2048, 2048, "bf16"), Cluster(gpu, 1, 1),
                    engine=engine, job=Job(32), max_batch=32,
                    pins=Pins((1,), (1,))).table.iloc[0]
    assert pred.tokens_per_s_per_gpu == pytest.approx(direct.tokens_per_s_per_gpu)
    assert pred.ttft_ms == pytest.approx(direct.ttft_ms)


def test_a_job_reports_its_medians_and_tail_in_order() -> None:
    """ShareGPT lengths spread the requests: the median TTFT, TPOT and latency sit
    below the 99th percentile, the tail above the mean, for every layout."""
    w = InferenceWorkload(202, 179, "bf16", 222.0, 188.0)
    table = search(MODEL, w, CLUSTER, engine=VLLM, job=Job(300, None, 8.0),
                   pins=Pins((1,), (1,))).table
    for name in ("ttft", "tpot", "latency"):
        p50, p99 = table[f"{name}_p50_ms"], table[f"{name}_p99_ms"]
        assert (p50 > 0).all() and (p50 < p99).all() and (table[f"{name}_ms"] < p99).all()


def test_published_medians_are_scored_on_the_jobs_medians() -> None:
    """J080 (SGLang's bench_serving at 4 requests/s) publishes medians: its TTFT and
    TPOT are scored against the job's p50, not its mean."""
    from autoconfig.inference.published import _scored
    points = load_points(default_points_path())
    row = next(r for r in points.itertuples(index=False) if r.point_id == "J080")
    assert row.statistic == "median" and row.num_requests == 1200
    pred = ask(row)
    scored = _scored(row, pred)
    assert scored["predicted_ttft"] == pytest.approx(pred.ttft_p50_ms)
    assert scored["predicted_tpot"] == pytest.approx(pred.tpot_p50_ms)
    assert pred.ttft_p50_ms != pytest.approx(pred.ttft_ms)


SGLANG = engines.get_engine("sglang")


def test_an_overlap_scheduler_delays_each_arrival_by_the_step_it_built() -> None:
    """SGLang's overlap event loop builds step k + 1 while step k runs: a request
    sent during step k first runs in step k + 2, one decode step later than
    under a scheduler that builds each step after the last."""
    assert SGLANG.overlap_schedule and not VLLM.overlap_schedule
    off = engines.with_overlap_schedule(SGLANG, False)
    w = InferenceWorkload(512, 256, "bf16")
    # 2 requests/s against ~4 s requests: about 8 in flight, each arrival mid-run
    ahead = job_row(w, Job(300, None, 2.0), engine=SGLANG)
    after = job_row(w, Job(300, None, 2.0), engine=off)
    extra = ahead.ttft_p50_ms - after.ttft_p50_ms
    assert 0.6 * after.tpot_p50_ms < extra < 1.6 * after.tpot_p50_ms
    assert ahead.tpot_ms == pytest.approx(after.tpot_ms, rel=0.05)  # decoding is unchanged
    # an idle engine builds at once: one request alone waits for nothing
    alone = [job_row(w, Job(1, None, 1.0), engine=e).ttft_ms for e in (SGLANG, off)]
    assert alone[0] == pytest.approx(alone[1])


def test_an_overlap_scheduler_admits_a_clients_next_request_a_step_later() -> None:
    inputs, outputs = np.full(4, 64), np.array([8, 20, 8, 8])
    plans = [schedule(inputs, outputs, 2, 64, 1e9, None, False, overlap=o)
             for o in (False, True)]
    # request 0 ends at step 8 while request 1 runs on: its client's next request
    # (2) is prefilled in the next step, or, under overlap, one step later
    first = [int(p.steps.cumsum()[p.first_token[2]]) for p in plans]
    assert first[1] == first[0] + 1
    # clients whose requests all end together find the engine idle: no wait
    both = [schedule(np.full(4, 64), np.full(4, 8), 2, 64, 1e9, None, False, overlap=o)
            for o in (False, True)]
    assert both[0].steps.sum() == both[1].steps.sum()


def test_steady_state_ttft_waits_one_step_more_under_an_overlap_scheduler() -> None:
    off = engines.with_overlap_schedule(SGLANG, False)
    w = InferenceWorkload(512, 256, "bf16")
    rows = [search(MODEL, w, CLUSTER, engine=e, mode="continuous", pins=Pins((1,), (1,), (32,)))
            .table.iloc[0] for e in (SGLANG, off)]
    # One step more (the burst term reads a request's lifetime, which that step
    # lengthens a little, hence not to the last digit).
    assert rows[0].ttft_ms - rows[1].ttft_ms == pytest.approx(rows[1].tpot_ms, rel=0.01)
    assert rows[0].tpot_ms == pytest.approx(rows[1].tpot_ms)


def test_overlap_flag_through_the_cli(capsys, tmp_path) -> None:
    args = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
            "--input-len", "512", "--output-len", "128", "--no-plots", "--format", "json",
            "-o", str(tmp_path)]
    code, out, err = run_cli(args + ["--engine", "sglang", "--no-overlap-schedule"], capsys)
    assert code == 0, err
    assert json.loads(out)["overlap_schedule"] is False
    code, _, err = run_cli(args + ["--engine", "fastertransformer", "--overlap-schedule"],
                           capsys)
    assert code == 2 and "--overlap-schedule" in err and "static" in err
    assert len(err.strip().splitlines()) == 1


def test_published_overlap_settings_follow_the_engine_each_source_ran() -> None:
    points = load_points(default_points_path())
    trt = points[points.engine == "tensorrt-llm"]
    # every TensorRT-LLM row ran TensorRT engines (C++ executor), no overlap scheduler
    assert len(trt) > 0 and (trt.overlap_schedule.astype(str).str.lower() == "false").all()
    si10 = points[points.source_id == "SI10"]
    assert len(si10) >= 19 and si10.overlap_schedule.isna().all()     # SGLang 0.4's default
    row = next(r for r in si10.itertuples(index=False) if r.point_id == "J158")
    assert str(row.length_dist).startswith("uniform")
    pred = ask(row)
    w = InferenceWorkload(509, 534, "bf16", 295.6, 295.9, "uniform")
    direct = search(get_model("llama3-70b"), w, Cluster(get_gpu("h200"), 1, 4),
                    engine=engines.with_kv_memory_fraction(SGLANG, 0.85),
                    job=Job(300, None, 1.0), pins=Pins((4,), (1,))).table.iloc[0]
    assert pred.ttft_p50_ms == pytest.approx(direct.ttft_p50_ms)


def _sglang_ratio():
    return engines.get_engine("sglang").new_token_ratio


def test_exact_admission_never_evicts_and_counts_what_finishing_requests_free() -> None:
    # 20 requests of 100 + 100 tokens in a 1,000-token pool. Reserving each whole
    # sequence runs 5 at once; admitting on the prompt runs all 10 the pool holds
    # and then evicts; exact admission (SGLang, ignore_eos) never evicts, and runs
    # more than 5 where the staggered outputs of a second wave free room in time.
    inputs, outputs = np.full(20, 100), np.full(20, 100)
    exact = schedule(inputs, outputs, 20, 20, 1000.0, None, False, reserve_output=False,
                     admission="exact")
    assert exact.peak_kv_tokens <= 1000
    assert exact.prefill_tokens.sum() == inputs.sum()            # nothing recomputed
    assert (exact.finished >= 0).all()
    spread = np.arange(20) * 10 + 10
    staggered = schedule(np.full(20, 100), spread, 20, 20, 2000.0, None, False,
                         reserve_output=False, admission="exact")
    reserved = schedule(np.full(20, 100), spread, 20, 20, 2000.0, None, False,
                        reserve_output=True)
    assert staggered.decode_seqs.max() > reserved.decode_seqs.max()
    assert staggered.prefill_tokens.sum() == 20 * 100


def test_estimate_admission_holds_back_a_decaying_share_and_retracts_when_full() -> None:
    ratio = _sglang_ratio()
    inputs, outputs = np.full(200, 100), np.full(200, 400)
    kwargs = dict(reserve_output=False, ratio=ratio)
    estimate = schedule(inputs, outputs, 200, 200, 20_000.0, None, False,
                        admission="estimate", **kwargs)
    preempt = schedule(inputs, outputs, 200, 200, 20_000.0, None, False, **kwargs)
    # At the start 0.7 of every running output is held back: fewer run at once than
    # on the prompt alone, and fewer prompts are recomputed after evictions.
    first = int(np.argmax(estimate.prefill_tokens > 0))
    assert estimate.prefill_tokens[first] < preempt.prefill_tokens[first]
    assert estimate.prefill_tokens.sum() < preempt.prefill_tokens.sum()
    assert (estimate.finished >= 0).all()
    assert estimate.peak_kv_tokens <= 20_000 + 200


def test_estimate_admission_waits_for_the_share_to_decay() -> None:
    # One running request with 4,000 tokens to go holds back 2,800 (0.7) of a
    # 4,500-token pool: a second request of 1,000 + 1,000 waits until the share
    # has decayed enough (about 0.58, some 120 decode steps), not until the first
    # finishes; on its prompt alone it joins at once.
    ratio = _sglang_ratio()
    inputs, outputs = np.array([100, 1000]), np.array([4000, 1000])
    plan = schedule(inputs, outputs, 2, 2, 4_500.0, None, False, reserve_output=False,
                    admission="estimate", ratio=ratio)
    second_admitted = int(np.nonzero(plan.prefill_tokens == 1000)[0][0])
    assert 60 < plan.steps[:second_admitted].sum() < 200
    at_once = schedule(inputs, outputs, 2, 2, 4_500.0, None, False, reserve_output=False)
    assert at_once.prefill_tokens[0] == 1100
