"""Layer-wise activation offloading (``--cpu-offload-layers``): the GPU keeps the
other layers' activations, the copies cost what they outlast their neighbours'
compute, and what megatron-core cannot offload is refused in one line."""

import json

import numpy as np
import pytest

from autoconfig.training import offload
from autoconfig.validation.runs import estimate_args, load_runs
from autoconfig.validation.scoring import default_runs_path
from cli_runner import run_cli

LLAMA70 = ["--model", "llama3", "--size", "70b", "--gpus", "64", "--tp", "1", "--pp", "1",
           "--mbs", "2", "--gbs", "256", "--seq-len", "8192", "--precision", "fp8",
           "--stack", "nemo", "--fsdp-sharding", "full-shard", "--format", "json"]


def _estimate(capsys, gpu, layers, *extra):
    code, out, err = run_cli(["estimate", *LLAMA70, "--gpu", gpu, "--cpu-offload-layers",
                              str(layers), *extra], capsys)
    assert code == 0, err
    return json.loads(out)


def test_offloaded_layers_leave_the_gpu_but_one_in_flight(capsys):
    base = _estimate(capsys, "gb200", 0)["memory_breakdown_gib"]["activations"]
    for n in (20, 40):
        kept = _estimate(capsys, "gb200", n)["memory_breakdown_gib"]["activations"]
        # 80 layers of equal size: 80 - n held, plus the one whose copy is in flight
        assert kept == pytest.approx(base * (80 - n + 1) / 80, rel=1e-9)


def test_copies_cost_what_they_outlast_the_compute_beside_them(capsys):
    nvlink_c2c = [_estimate(capsys, "gb200", n)["time_breakdown_s"] for n in (0, 20, 40)]
    pcie = _estimate(capsys, "b200", 20)["time_breakdown_s"]
    assert nvlink_c2c[0]["offload"] == 0.0
    # each offloaded layer adds the same exposed copy time
    assert nvlink_c2c[2]["offload"] == pytest.approx(2 * nvlink_c2c[1]["offload"], rel=1e-9)
    # the compute itself is untouched
    assert nvlink_c2c[1]["compute"] == pytest.approx(nvlink_c2c[0]["compute"])
    # PCIe Gen5 (63 GB/s each way) against a share of NVLink-C2C (225 GB/s each way)
    assert pcie["offload"] > 3 * nvlink_c2c[1]["offload"] > 0


def test_exposed_time_is_the_excess_over_each_neighbour():
    assert offload.exposed_s(4, 1.0, 2.0, 3.0) == 0.0
    assert offload.exposed_s(4, 2.5, 2.0, 3.0) == pytest.approx(4 * 0.5)
    assert offload.exposed_s(4, 4.0, 2.0, 3.0) == pytest.approx(4 * (2.0 + 1.0))
    held = offload.held_layers(np.array([80.0, 80.0]), np.array([0.0, 30.0]))
    assert held.tolist() == [80.0, 51.0]


@pytest.mark.parametrize("extra, words", [
    (["--pp", "2"], ("pipeline parallelism", "--pp 1")),
    (["--recompute", "full"], ("recompute", "--recompute none")),
    (["--cpu-offload-layers", "80"], ("80", "fewer than", "80 layers")),
    (["--cuda-graph", "te-scoped"], ("CUDA graphs", "--cuda-graph none")),
    (["--gpu", "l40s"], ("host-link", "l40s")),
    (["--cpu-offload-layers", "-3"], ("-3", "whole number")),
    (["--stack", "pytorch-fsdp"], ("megatron-core", "pytorch-fsdp", "--stack megatron-lm")),
])
def test_what_megatron_cannot_offload_is_one_line(capsys, extra, words):
    code, out, err = run_cli(["estimate", *LLAMA70, "--gpu", "gb200", "--cpu-offload-layers",
                              "20", *extra], capsys)
    assert code == 2 and not out and err.count("\n") == 1
    assert all(w in err for w in words), err


def test_search_keeps_to_what_offloading_allows(capsys, tmp_path):
    code, out, err = run_cli(["search", "--model", "llama3", "--size", "8b", "--gpu", "h100",
                              "--gpus", "8", "--gbs", "64", "--stack", "megatron-lm",
                              "--cpu-offload-layers", "8", "--format", "json", "--no-plots",
                              "-o", str(tmp_path)], capsys)
    assert code == 0, err
    plans = json.loads(out)["top"]
    assert plans and all(p["pp"] == 1 and p["recompute"] == "none" for p in plans)
    code, _, err = run_cli(["search", "--model", "llama3", "--size", "8b", "--gpu", "h100",
                            "--gpus", "8", "--gbs", "64", "--pp", "2", "--cpu-offload-layers",
                            "8", "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 2 and "pipeline parallelism" in err and err.count("\n") == 1


def test_published_offloading_rows_carry_their_recipes_layers():
    runs = {r.record_id: r for r in load_runs(default_runs_path())}
    for record, layers in (("R0106", 20), ("R0124", 20), ("R0125", 40)):
        args = [str(a) for a in estimate_args(runs[record])]
        assert args[args.index("--cpu-offload-layers") + 1] == str(layers)
        assert args[args.index("--fp8-recipe") + 1] == "tensorwise"
