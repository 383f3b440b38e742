"""How a router spreads a cluster's requests over replicas (``infer --dispatch``):
round-robin sends each replica every k-th arrival, so its arrivals bunch less
than a Poisson stream's, and the steps that admit several prompts at once (and
the decodes waiting through them) are rarer."""

import dataclasses
import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.dispatch import arrival_cv2, replica_arrivals_s
from autoconfig.inference.job import Job
from autoconfig.inference.plan import InferenceWorkload
from autoconfig.inference.search import Pins, search


def _cv2(times: np.ndarray) -> float:
    gaps = np.diff(times)
    return float(gaps.var() / gaps.mean() ** 2)


def test_round_robin_gives_each_replica_every_kth_arrival() -> None:
    rr = replica_arrivals_s(80.0, 4000, 8, "round-robin", seed=3)
    rnd = replica_arrivals_s(80.0, 4000, 8, "random", seed=3)
    for times in (rr, rnd):                       # a replica's share of the rate either way
        assert len(times) == 4000 and times[0] == 0.0
        assert np.mean(np.diff(times)) == pytest.approx(8 / 80.0, rel=0.02)
    assert _cv2(rr) == pytest.approx(1 / 8, abs=0.03)        # Erlang-8 gaps
    assert _cv2(rnd) == pytest.approx(1.0, abs=0.1)          # exponential gaps
    assert (replica_arrivals_s(10.0, 50, 1, "round-robin", seed=3)
            == replica_arrivals_s(10.0, 50, 1, "random", seed=3)).all()
    assert arrival_cv2("round-robin", np.array([1, 4])) == pytest.approx([1.0, 0.25])
    assert arrival_cv2("random", 4) == pytest.approx(1.0)


def test_an_unknown_dispatch_is_refused_by_name() -> None:
    with pytest.raises(InputError, match="invalid --dispatch 'least'.*round-robin, random"):
        InferenceWorkload(128, 128, dispatch="least")


MODEL, GPU = get_model("llama3-8b"), get_gpu("h200")
ENGINE = engines.get_engine("tensorrt-llm")


def _row(workload, gpus, **kwargs):
    return search(MODEL, workload, Cluster(GPU, 1, gpus), engine=ENGINE, mode="continuous",
                  pins=Pins((1,), (1,)), **kwargs).table.iloc[0]


def test_a_job_on_many_replicas_has_a_tighter_tail_behind_round_robin() -> None:
    # 8 replicas of Llama 3 8B at 3/4 of their load (MLPerf's CNN/DailyMail lengths):
    # random dispatch bunches prompts on some replicas for seconds.
    w = InferenceWorkload(871, 128, "fp8", 430, 0.0)
    job = Job(8000, None, 300.0)
    rr = _row(w, 8, job=job)
    rnd = _row(dataclasses.replace(w, dispatch="random"), 8, job=job)
    assert rr.tpot_p99_ms < 0.9 * rnd.tpot_p99_ms
    assert rr.ttft_p99_ms < 0.7 * rnd.ttft_p99_ms
    assert rr.tokens_per_s_per_gpu == pytest.approx(rnd.tokens_per_s_per_gpu, rel=0.01)
    one = [_row(dataclasses.replace(w, dispatch=d), 1, job=Job(1000, None, 47.5))
           for d in ("round-robin", "random")]
    assert one[0].tpot_ms == one[1].tpot_ms and one[0].ttft_ms == one[1].ttft_ms


def test_the_steady_state_burst_wait_shrinks_with_round_robin() -> None:
    w = InferenceWorkload(2048, 128, "fp8")
    rr = _row(w, 8, request_rate_per_s=150.0)
    rnd = _row(dataclasses.replace(w, dispatch="random"), 8, request_rate_per_s=150.0)
    assert rr.ttft_ms < rnd.ttft_ms
    one = [_row(dataclasses.replace(w, dispatch=d), 1, request_rate_per_s=18.0)
           for d in ("round-robin", "random")]
    assert one[0].ttft_ms == one[1].ttft_ms


CLI = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h200", "--gpus", "8", "--tp", "1",
       "--pp", "1", "--engine", "tensorrt-llm", "--precision", "fp8", "--input-len", "871",
       "--output-len", "128", "--no-plots"]


def test_the_cli_says_how_arrivals_are_spread_and_random_waits_longer(tmp_path, capsys):
    from cli_runner import run_cli
    rows = {}
    for dispatch in ("round-robin", "random"):
        code, out, err = run_cli(CLI + ["--request-rate", "150", "--dispatch", dispatch,
                                        "--format", "json", "-o", str(tmp_path / dispatch)],
                                 capsys)
        assert code == 0, err
        rows[dispatch] = json.loads(out)["plans"][0]
    assert rows["round-robin"]["ttft_ms"] < rows["random"]["ttft_ms"]
    code, out, err = run_cli(CLI + ["--request-rate", "300", "--num-requests", "2000",
                                    "-o", str(tmp_path / "job")], capsys)
    assert code == 0, err
    assert "2000 requests arriving at 300/s (Poisson, spread round-robin over replicas)" in out


def test_dispatch_without_a_rate_is_refused(tmp_path, capsys):
    from cli_runner import run_cli
    code, out, err = run_cli(CLI + ["--dispatch", "random", "-o", str(tmp_path)], capsys)
    assert code != 0 and "--dispatch random spreads arrivals at a rate" in err
    assert "Traceback" not in err
    # a Python caller gets the same refusal
    with pytest.raises(InputError, match="--dispatch random spreads arrivals at a rate"):
        _row(InferenceWorkload(871, 128, "fp8", dispatch="random"), 8)
    with pytest.raises(InputError, match="--dispatch random spreads arrivals at a rate"):
        _row(InferenceWorkload(871, 128, "fp8", dispatch="random"), 8, job=Job(100))
