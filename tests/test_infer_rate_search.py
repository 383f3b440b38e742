"""The largest request rate within latency limits (``infer --request-rate max``,
MLPerf Server's question): the bisection, the search that runs the job at each
rate it tries, the CLI, and the published MLPerf Server points asked that way."""

import dataclasses
import json
import math

import numpy as np

import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InfeasibleError, InputError
from autoconfig.inference import engine as engines
from autoconfig.inference.job import Job, run
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload
from autoconfig.inference.published import ask, default_points_path, load_points
from autoconfig.inference.rate_search import RATE_TOLERANCE, STEEP_LOAD, largest_rate
from autoconfig.inference.report import load_line, render
from autoconfig.inference.search import Limits, search
from autoconfig.training.step_time import load_constants
from cli_runner import run_cli

MODEL = get_model("llama3-8b")
CLUSTER = Cluster(get_gpu("h100-80gb"), 1, 1)
VLLM = engines.get_engine("vllm")
WORKLOAD = InferenceWorkload(512, 128, "bf16", 200.0, 60.0)
REQUESTS = 400
BASE = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
        "--engine", "vllm", "--no-plots", "--input-len", "512", "--output-len", "128"]


class Counted:
    """``rate <= threshold``, counting the calls."""

    def __init__(self, threshold: float) -> None:
        self.threshold, self.calls = threshold, 0

    def __call__(self, rate: float) -> bool:
        self.calls += 1
        return rate <= self.threshold


@pytest.mark.parametrize("threshold, start", [(37.0, 100.0), (37.0, 10.0), (99.0, 100.0)])
def test_bisection_finds_the_top_of_the_feasible_rates(threshold, start) -> None:
    meets = Counted(threshold)
    rate = largest_rate(meets, start)
    assert threshold / RATE_TOLERANCE <= rate <= threshold
    assert meets.calls <= 12


def test_bisection_says_when_every_rate_or_none_meets() -> None:
    assert largest_rate(lambda r: True, 5.0) == math.inf
    assert largest_rate(lambda r: False, 5.0) is None
    with pytest.raises(ValueError):
        largest_rate(lambda r: True, 0.0)


def _at_rate(rate: float, steady: bool = True):
    """The job sent at ``rate``, its latencies over its steady part as the search
    takes them (``steady``) or over all its requests."""
    plan = InferencePlanTable.from_plans([InferencePlan(1, 1, 256, 1)])
    return run(MODEL, WORKLOAD, plan, CLUSTER, load_constants(), VLLM,
               Job(REQUESTS, None, rate, steady=steady)).iloc[0]


def test_the_rate_found_meets_the_p99_limits_and_a_higher_one_breaks_them() -> None:
    limits = Limits(max_ttft_ms=400.0, max_tpot_ms=25.0, statistic="p99")
    result = search(MODEL, WORKLOAD, CLUSTER, limits=limits, engine=VLLM, max_batch=256,
                    job=Job(REQUESTS, rate_search=True))
    row = result.table.iloc[0]
    rate = float(row.request_rate_per_s)
    assert 0 < rate < math.inf
    assert row.ttft_p99_ms <= 400.0 and row.tpot_p99_ms <= 25.0
    # the row is the job at that rate, and a rate one tolerance step higher breaks a limit
    again = _at_rate(rate)
    assert again.ttft_p99_ms == pytest.approx(row.ttft_p99_ms)
    higher = _at_rate(rate * RATE_TOLERANCE ** 2)
    assert higher.ttft_p99_ms > 400.0 or higher.tpot_p99_ms > 25.0
    # a mean bound is looser than the same p99 bound: a higher rate meets it
    mean = search(MODEL, WORKLOAD, CLUSTER, limits=Limits(400.0, 25.0), engine=VLLM,
                  max_batch=256, job=Job(REQUESTS, rate_search=True))
    assert mean.table.iloc[0].request_rate_per_s > rate


def test_the_rate_found_is_given_as_its_share_of_the_rate_completed_offline() -> None:
    """load_fraction: the searched rate over the rate the same job completes sent
    at once; below STEEP_LOAD the report adds no note, at or above it one, and
    above 1 it says the job is too short for its queue to show."""
    limits = Limits(max_ttft_ms=400.0, max_tpot_ms=25.0, statistic="p99")
    result = search(MODEL, WORKLOAD, CLUSTER, limits=limits, engine=VLLM, max_batch=256,
                    job=Job(REQUESTS, rate_search=True))
    row = result.table.iloc[0]
    offline = _at_rate(None)
    assert row.load_fraction == pytest.approx(
        row.request_rate_per_s / offline.requests_per_s_per_replica)
    assert 0 < row.load_fraction < STEEP_LOAD
    assert load_line(result) == "" and "load %" in render(result, 3)

    def loaded(load: float):
        table = result.table.copy()
        table.loc[table.index[0], "load_fraction"] = load
        return dataclasses.replace(result, table=table)
    steep = load_line(loaded(0.95))
    assert "95%" in steep and "5% error" in steep and "plan on the rate" in steep
    assert steep in render(loaded(0.95), 3)
    over = load_line(loaded(1.1))
    assert "110%" in over and "keep queueing" in over and "--num-requests" in over


def test_a_limit_no_rate_meets_is_infeasible_naming_the_best() -> None:
    with pytest.raises(InfeasibleError, match=r"TPOT \(p99\)"):
        search(MODEL, WORKLOAD, CLUSTER, limits=Limits(max_tpot_ms=0.5, statistic="p99"),
               engine=VLLM, max_batch=256, job=Job(REQUESTS, rate_search=True))


def test_a_searched_job_takes_no_clients() -> None:
    with pytest.raises(InputError, match="not both"):
        Job(10, 4, None, True)


def test_cli_prints_the_rate_found(capsys, tmp_path) -> None:
    code, out, err = run_cli(BASE + ["--num-requests", str(REQUESTS), "--request-rate", "max",
                                     "--max-ttft-ms", "400", "--max-tpot-ms", "25",
                                     "--limit-statistic", "p99", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert "rate/s" in out and "largest rate meeting the p99 latency limits" in out
    data = json.loads((tmp_path / "infer.json").read_text())
    assert data["job_rate_searched"] and data["limits"]["statistic"] == "p99"
    assert 0 < data["plans"][0]["request_rate_per_s"] < 1e9


@pytest.mark.parametrize("args, message", [
    (["--request-rate", "max", "--max-ttft-ms", "400"], "give --num-requests"),
    (["--num-requests", "10", "--request-rate", "max"], "needs a latency limit"),
    (["--num-requests", "10", "--request-rate", "fast"], "invalid --request-rate 'fast'"),
    (["--max-ttft-ms", "400", "--limit-statistic", "p99"], "give --num-requests"),
    (["--num-requests", "10", "--limit-statistic", "p95"], "p95"),
    # a percentile of no limit was ignored
    (["--num-requests", "10", "--limit-statistic", "p99"],
     "--limit-statistic p99 says what the latency limits bound, and none is given"),
    (["--num-requests", "10", "--request-rate", "max", "--concurrency", "4",
      "--max-ttft-ms", "400"], "not both"),
])
def test_bad_rate_search_input_is_one_line(capsys, tmp_path, args, message) -> None:
    code, out, err = run_cli(BASE + args + ["-o", str(tmp_path)], capsys)
    assert code != 0 and message in err
    assert "Traceback" not in err


def test_published_server_points_are_asked_for_their_rate_not_at_it() -> None:
    """An MLPerf Server row's scheduled rate is what the submitter found; its
    prediction does not read it, and meets the scenario's p99 bounds."""
    points = load_points(default_points_path())
    row = next(r for r in points.itertuples(index=False) if r.point_id == "J021")
    assert (row.limit_ttft_ms, row.limit_tpot_ms, row.limit_statistic) == (2000, 100, "p99")
    pred = ask(row)
    assert pred.ttft_p99_ms <= 2000 and pred.tpot_p99_ms <= 100
    moved = ask(row._replace(request_rate_per_s=row.request_rate_per_s * 3))
    assert moved.request_rate_per_s == pred.request_rate_per_s
    assert moved.tokens_per_s_per_gpu == pred.tokens_per_s_per_gpu


def test_the_search_reads_latencies_where_the_server_is_full() -> None:
    """A server that starts empty runs its first requests at low concurrency and its
    last ones draining; a long-running one (MLPerf Server) almost never does. The
    searched job's latencies are those of the requests that arrive in between
    (``jobs.steady_requests``): at a loaded rate their TPOT is above the whole
    job's, whose mean the empty start and end pull down."""
    limits = Limits(max_ttft_ms=400.0, max_tpot_ms=25.0, statistic="p99")
    row = search(MODEL, WORKLOAD, CLUSTER, limits=limits, engine=VLLM, max_batch=256,
                 job=Job(REQUESTS, rate_search=True)).table.iloc[0]
    rate = float(row.request_rate_per_s)
    steady, whole = _at_rate(rate), _at_rate(rate, steady=False)
    assert row.tpot_ms == pytest.approx(steady.tpot_ms)
    assert steady.tpot_ms > whole.tpot_ms
    assert steady.tokens_per_s_per_replica == pytest.approx(whole.tokens_per_s_per_replica)


def test_the_steady_window_skips_one_median_latency_at_each_end() -> None:
    from autoconfig.inference.job import MIN_STEADY_REQUESTS, steady_requests
    sent = np.arange(1000, dtype=float)               # one a second
    latency = np.full(1000, 50.0)
    keep = steady_requests(sent, latency)
    assert (keep.sum(), sent[keep].min(), sent[keep].max()) == (900, 50.0, 949.0)
    short = np.arange(MIN_STEADY_REQUESTS, dtype=float)
    assert steady_requests(short, np.full(len(short), 40.0)).all()   # too short: all
