"""Megatron-FSDP (``--fsdp-sharding full-shard`` on a megatron-core stack): the
Megatron-Bridge recipes' optim_grads_params sharding, priced, launched and
scored against the published rows that ran it."""

import json

import pytest

from autoconfig.validation.runs import estimate_args, load_runs
from autoconfig.validation.scoring import default_runs_path
from cli_runner import run_cli

LLAMA70_GB300 = ["--model", "llama3", "--size", "70b", "--gpu", "gb300", "--gpus", "64",
                 "--tp", "1", "--pp", "1", "--mbs", "1", "--gbs", "256", "--seq-len", "8192",
                 "--precision", "fp8", "--stack", "nemo", "--recompute", "full",
                 "--format", "json"]


def _estimate(capsys, *extra):
    code, out, err = run_cli(["estimate", *LLAMA70_GB300, *extra], capsys)
    assert code == 0, err
    return json.loads(out)


def test_sharding_takes_the_weights_and_gradients_off_each_gpu(capsys):
    plain = _estimate(capsys)
    sharded = _estimate(capsys, "--fsdp-sharding", "full-shard")
    assert sharded["software"]["megatron_fsdp"] and not plain["software"]["megatron_fsdp"]
    states = ("weights", "gradients", "optimizer")
    before = sum(plain["memory_breakdown_gib"][k] for k in states)
    after = sum(sharded["memory_breakdown_gib"][k] for k in states)
    # 70.6B parameters: 16-bit weights and fp32 gradients whole on each GPU beside the
    # distributed optimizer's 1/64 of the master state, against a 1/64 share of all
    # of it plus the two gathered layers and the unsharded embedding and output layer
    assert before > 300 and after < 0.1 * before
    assert not plain["fits"] and sharded["fits"]
    # the same compute; the per-micro-batch gathers and reduce-scatters only add
    assert sharded["time_breakdown_s"]["compute"] == pytest.approx(
        plain["time_breakdown_s"]["compute"])
    assert sharded["time_breakdown_s"]["dp_comm"] > plain["time_breakdown_s"]["dp_comm"]


def test_table_names_the_sharding(capsys):
    code, out, _ = run_cli(["estimate", *LLAMA70_GB300[:-2], "--fsdp-sharding", "full-shard"],
                           capsys)
    assert code == 0 and out.splitlines()[0].endswith("Megatron-FSDP full-shard")


@pytest.mark.parametrize("extra, words", [
    (["--fsdp-sharding", "shard-grad-op"], ("'shard-grad-op'", "full-shard")),
    (["--fsdp-sharding", "full-shard", "--model", "mixtral", "--size", "8x7b", "--ep", "8"],
     ("Megatron-FSDP", "ep 8", "--ep 1")),
])
def test_what_it_cannot_run_is_one_line(capsys, extra, words):
    code, out, err = run_cli(["estimate", *LLAMA70_GB300, *extra], capsys)
    assert code == 2 and not out and err.count("\n") == 1
    assert all(w in err for w in words), err


def test_search_with_sharding_refuses_to_profile(capsys, tmp_path):
    code, _, err = run_cli(["search", "--model", "gpt3", "--size", "1.3b", "--gpu", "h100",
                            "--gpus", "8", "--gbs", "64", "--stack", "nemo", "--fsdp-sharding",
                            "full-shard", "--profile", "--device", "cpu", "--dry-run",
                            "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1 and "Megatron-FSDP" in err


def test_published_megatron_fsdp_rows_are_scored_as_their_recipe_ran():
    runs = {r.record_id: r for r in load_runs(default_runs_path())}
    for record in ("R0106", "R0124", "R0125"):   # Bridge Llama 3 70B, FSDP on GB200/GB300
        run = runs[record]
        assert not run.skip_reason and run.software.megatron_fsdp
        args = [str(a) for a in estimate_args(run)]
        assert args[args.index("--fsdp-sharding") + 1] == "full-shard"
    for record in ("M0119", "M0120"):   # hybrid sharding (HSDP): not modelled
        assert "HSDP" in runs[record].skip_reason


def test_a_plan_that_does_not_fit_says_what_sharding_would_need(capsys):
    plain = _estimate(capsys)
    sharded = _estimate(capsys, "--fsdp-sharding", "full-shard")
    assert not plain["fits"]
    # the figure the hint gives is what the sharded estimate itself computes
    assert plain["megatron_fsdp_memory_gib"] == pytest.approx(sharded["memory_gib"])
    assert "megatron_fsdp_memory_gib" not in sharded
    code, out, _ = run_cli(["estimate", *LLAMA70_GB300[:-2]], capsys)
    assert code == 0 and f"needs {sharded['memory_gib']:.2f} GiB a GPU: fits" in out


def test_search_names_sharding_among_what_would_fit(capsys, tmp_path):
    code, _, err = run_cli(["search", "--model", "llama3", "--size", "70b", "--gpu", "gb200",
                            "--gpus", "64", "--tp", "1", "--pp", "1", "--cp", "1", "--gbs", "256",
                            "--seq-len", "8192", "--precision", "fp8", "--stack", "nemo",
                            "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 2 and err.count("\n") == 1 and "no plan fits" in err
    assert "--fsdp-sharding full-shard" in err
    code, _, err = run_cli(["search", "--model", "llama3", "--size", "70b", "--gpu", "gb200",
                            "--gpus", "64", "--tp", "1", "--pp", "1", "--cp", "1", "--gbs", "256",
                            "--seq-len", "8192", "--precision", "fp8", "--stack", "nemo",
                            "--fsdp-sharding", "full-shard", "--no-plots", "-o",
                            str(tmp_path / "sharded")], capsys)
    assert code == 0, err
