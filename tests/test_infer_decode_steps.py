"""Multi-step decoding (vLLM --num-scheduler-steps, SGLang
--num-continuous-decode-steps): the scheduler acts between whole runs of
decode steps, so its host time is paid once per run and new requests wait for
the run to end."""

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.job import Job, host_step_s, run, schedule
from autoconfig.inference.latency import latency
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.published import ask, default_points_path, load_points
from autoconfig.training.step_time import load_constants
from cli_runner import run_cli

MODEL = get_model("llama3-8b")
CLUSTER = Cluster(get_gpu("a100-80gb"), 1, 1)
VLLM = engines.get_engine("vllm")
BASE = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "a100", "--gpus", "1",
        "--input-len", "218", "--output-len", "194", "--no-plots"]


def test_decode_runs_are_whole_multiples_and_arrivals_wait_for_them() -> None:
    n = 40
    inputs, outputs = np.full(n, 64), np.full(n, 37)
    arrivals = np.arange(n) * 0.05

    def planned(k):
        from autoconfig.inference.job import _Clock
        clock = _Clock(lambda decodes, prefill: 0.01, lambda *a: np.full(len(a[0]), 0.01))
        return schedule(inputs, outputs, n, 64, 1e9, None, True, True, arrivals, clock, k)
    one, ten = planned(1), planned(10)
    decode = ten.prefill_tokens == 0
    assert (ten.steps[decode] % 10 == 0).all()           # whole runs only
    assert not (one.steps[one.prefill_tokens == 0] % 10 == 0).all()
    # A request's prefill waits for the run under way: later first tokens.
    assert (ten.first_token >= 0).all() and (one.first_token >= 0).all()
    assert ten.steps[: ten.first_token.max() + 1].sum() > one.steps[: one.first_token.max()
                                                                     + 1].sum()


def test_the_scheduler_host_time_is_paid_once_per_run() -> None:
    ten = engines.with_decode_steps(VLLM, 10)
    assert host_step_s(ten, np.array([0.0]))[0] == pytest.approx(VLLM.step_overhead_s / 10)
    assert host_step_s(ten, np.array([128.0]))[0] == pytest.approx(VLLM.step_overhead_s)
    assert host_step_s(VLLM, np.array([0.0]))[0] == pytest.approx(VLLM.step_overhead_s)


def test_steady_state_trades_tpot_for_ttft() -> None:
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 64, 1)])
    w = InferenceWorkload(218, 194)
    c = load_constants()
    base = latency(MODEL, w, plans, CLUSTER, c, VLLM, "continuous")
    multi = latency(MODEL, w, plans, CLUSTER, c, engines.with_decode_steps(VLLM, 10),
                    "continuous")
    saved = VLLM.step_overhead_s * (1 - 1 / 10)
    assert base.tpot_s[0] - multi.tpot_s[0] == pytest.approx(saved)
    # Half a 10-step run of waiting instead of half a step, and a prefill step
    # that takes the prompts gathered over the run (latency.prompt_window).
    waited = 10 * multi.tpot_s[0] / 2 - base.tpot_s[0] / 2
    gathered = multi.ttft_s[0] - base.ttft_s[0] - waited
    assert 0 < gathered < base.ttft_s[0]


def test_a_job_at_a_rate_waits_longer_for_its_first_token_and_decodes_faster() -> None:
    plans = InferencePlanTable.from_plans([InferencePlan(1, 1, 256, 1)])
    w = InferenceWorkload(218, 194)
    rows = [run(MODEL, w, plans, CLUSTER, load_constants(), e, Job(300, None, 4.0)).iloc[0]
            for e in (VLLM, engines.with_decode_steps(VLLM, 10))]
    assert rows[1].ttft_ms > 1.5 * rows[0].ttft_ms
    assert rows[1].tpot_ms < rows[0].tpot_ms


def test_published_vllm_060_points_are_asked_with_their_scheduler_steps() -> None:
    points = load_points(default_points_path())
    row = next(r for r in points.itertuples(index=False) if r.point_id == "J081")
    assert row.decode_steps == 10
    asked = ask(row)
    alone = ask(row._replace(decode_steps=float("nan")))
    assert asked.ttft_ms > alone.ttft_ms


@pytest.mark.parametrize("args, message", [
    (["--engine", "tensorrt-llm", "--decode-steps", "4"], "engines with multi-step decoding"),
    (["--engine", "vllm", "--decode-steps", "0"], "--decode-steps 0"),
    (["--engine", "vllm", "--decode-steps", "4", "--batch", "8"], "static batches"),
])
def test_bad_decode_steps_are_one_line(capsys, tmp_path, args, message) -> None:
    code, _, err = run_cli(BASE + args + ["-o", str(tmp_path)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_an_engine_file_cannot_claim_steps_it_has_no_option_for() -> None:
    with pytest.raises(InputError, match="runs one decode step"):
        engines.with_decode_steps(engines.get_engine("lmdeploy"), 2)
    sglang = engines.with_decode_steps(engines.get_engine("sglang"), 4)
    assert sglang.decode_steps == 4 and sglang.decode_steps_option == \
        "--num-continuous-decode-steps"


def test_the_report_says_the_engine_ran_multi_step(capsys, tmp_path) -> None:
    code, _, err = run_cli(BASE + ["--engine", "sglang", "--decode-steps", "4",
                                   "--concurrency", "16", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert "4 decode steps per scheduler call (--num-continuous-decode-steps 4)" in err
