"""``infer`` refuses a request part of which would be silently ignored: a length
law without spread lengths to shape, more clients than a job has requests;
through the library (a Python caller) and the real CLI."""

import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.errors import InputError
from autoconfig.inference.job import Job
from autoconfig.inference.plan import InferenceWorkload
from autoconfig.inference.search import search
from cli_runner import run_cli

MODEL = get_model("llama3-8b")
CLUSTER = Cluster(get_gpu("h100-80gb"), 1, 1)
BASE = ["infer", "--model", "llama3", "--size", "8b", "--gpu", "h100", "--gpus", "1",
        "--engine", "vllm", "--no-plots"]
FIXED = ["--input-len", "512", "--output-len", "128", "--num-requests", "100"]
NO_SPREAD = ("--length-dist {law} shapes spread lengths, and none is given: add "
             "--input-len-std or --output-len-std above 0, or a --dataset with spreads "
             "(or drop --length-dist)")
CLIENTS = ("invalid --concurrency 64 with --num-requests 10: more clients than requests "
           "would send them all at once; give at most 10 clients, or drop --concurrency to "
           "send them all at once")


@pytest.mark.parametrize("law", ["gamma", "uniform"])
@pytest.mark.parametrize("spread", [[], ["--input-len-std", "0", "--output-len-std", "0"]])
def test_a_length_law_without_spread_lengths_is_refused(capsys, tmp_path, law, spread):
    code, _, err = run_cli(BASE + FIXED + spread + ["--length-dist", law, "-o", str(tmp_path)],
                           capsys)
    assert code == 2 and err == f"error: {NO_SPREAD.format(law=law)}\n"


def test_a_python_caller_gets_the_same_refusal_of_a_law_without_spread():
    workload = InferenceWorkload(512, 128, "bf16", length_dist="uniform")
    with pytest.raises(InputError) as info:
        search(MODEL, workload, CLUSTER, job=Job(100))
    assert str(info.value) == NO_SPREAD.format(law="uniform")


def test_more_clients_than_requests_is_refused(capsys, tmp_path):
    code, _, err = run_cli(BASE + ["--input-len", "512", "--output-len", "128",
                                   "--num-requests", "10", "--concurrency", "64",
                                   "-o", str(tmp_path)], capsys)
    assert code == 2 and err == f"error: {CLIENTS}\n"
    with pytest.raises(InputError) as info:
        search(MODEL, InferenceWorkload(512, 128), CLUSTER, job=Job(10, 64))
    assert str(info.value) == CLIENTS


OUTSIDE_JOB = ("--length-dist {law} shapes the lengths of a --num-requests job; the steady "
               "state reads only their means and spreads: give --num-requests (or drop "
               "--length-dist)")


@pytest.mark.parametrize("law", ["gamma", "uniform"])
def test_a_length_law_outside_a_job_is_refused(capsys, tmp_path, law):
    spread = ["--input-len", "512", "--output-len", "128", "--input-len-std", "100"]
    code, _, err = run_cli(BASE + spread + ["--length-dist", law, "-o", str(tmp_path)], capsys)
    assert code == 2 and err == f"error: {OUTSIDE_JOB.format(law=law)}\n"
    code, _, err = run_cli(BASE + spread + ["--length-dist", law, "--num-requests", "50",
                                            "-o", str(tmp_path / "job")], capsys)
    assert code == 0, err
    with pytest.raises(InputError) as info:
        search(MODEL, InferenceWorkload(512, 128, "bf16", 100.0, 0.0, "uniform"), CLUSTER)
    assert str(info.value) == OUTSIDE_JOB.format(law="uniform")
