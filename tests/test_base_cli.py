"""``autoconfig base`` through the real command line (a subprocess each)."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from autoconfig.base.config import read_base_yaml
from autoconfig.cli import main
from autoconfig.errors import InputError


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoconfig", "base", *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd)


def invoke_main(*args: str) -> tuple[int, str, str]:
    """``autoconfig.cli.main`` in-process with captured streams: (exit code, stdout, stderr)."""
    with CliRunner().isolation() as (out, err, _):
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue().decode(), err.getvalue().decode()


def run_json(*args: str) -> dict:
    proc = run(*args, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_gpt3_175b_json():
    out = run_json("--model", "gpt3", "--size", "175b")
    model, training, optimizer = out["model"], out["training"], out["optimizer"]
    assert (model["num_layers"], model["hidden_size"], model["num_heads"]) == (96, 12288, 96)
    assert training["params"] == pytest.approx(174.6e9, rel=5e-3)
    assert optimizer["lr"] == 6e-05
    assert training["global_batch_size"] == 1536 and training["seq_len"] == 2048
    assert optimizer["min_lr"] == pytest.approx(6e-06)


def test_budget_example_is_consistent_with_its_formula_and_inverse():
    out = run_json("--model", "gpt3", "--nodes", "128", "--gpus-per-node", "8",
                   "--gpu", "a100-80gb", "--days", "24", "--tokens", "300b")
    t = out["training"]
    assert out["mode"] == "budget"
    assert t["flops_formula"] == "6NT" and t["utilisation_kind"] == "mfu"
    assert t["tokens"] == 300e9 and t["budget_days"] == 24
    # the stated formula: days = 6 N T / (GPUs x peak x MFU)
    rate = 1024 * t["peak_tflops_per_gpu"] * 1e12 * t["utilisation"]
    assert t["total_flops"] == pytest.approx(6 * t["params"] * 300e9, rel=1e-12)
    assert t["days"] == pytest.approx(t["total_flops"] / rate / 86400, rel=1e-9)
    # the inverse: days of that exact size within 1% of the budget, never above
    assert 0.99 * 24 <= t["days"] <= 24


def test_gpus_is_an_alternative_to_nodes():
    common = ("--gpu", "h100", "--days", "30", "--tokens", "1t")
    by_nodes = run_json(*common, "--nodes", "32")
    by_gpus = run_json(*common, "--gpus", "256")
    assert by_nodes == by_gpus


def test_full_recompute_says_8nt_and_hfu():
    out = run_json("--gpu", "a100-80gb", "--nodes", "64", "--days", "30", "--tokens", "300b",
                   "--full-recompute")
    assert out["training"]["flops_formula"] == "8NT"
    assert out["training"]["utilisation_kind"] == "hfu"


def test_table_and_output_yaml_round_trip(tmp_path):
    path = tmp_path / "base.yaml"
    proc = run("--model", "llama3", "--size", "8b", "--gpu", "h100", "--nodes", "4",
               "--tokens", "1t", "-o", str(path))
    assert proc.returncode == 0, proc.stderr
    for word in ("llama3-8b", "training days", "global_batch_size", "lr", "wrote"):
        assert word in proc.stdout
    cfg = read_base_yaml(path)
    assert cfg.model.name == "llama3-8b" and cfg.nodes == 4 and cfg.gpu_name == "h100-80gb"
    as_json = run_json("--model", "llama3", "--size", "8b", "--gpu", "h100", "--nodes", "4",
                       "--tokens", "1t")
    assert as_json["training"]["global_batch_size"] == cfg.global_batch_size
    assert as_json["optimizer"]["lr"] == cfg.lr and as_json["training"]["days"] == cfg.days


def test_yaml_format_reads_back(tmp_path):
    proc = run("--model", "gpt3", "--size", "1.3b", "--format", "yaml")
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "out.yaml"
    path.write_text(proc.stdout)
    assert read_base_yaml(path).lr == 2.0e-4


BUDGET = ("--gpu", "a100-80gb", "--days", "10", "--tokens", "300b")


@pytest.mark.parametrize("args,names", [
    (("--model", "gpt9", "--size", "175b"), "gpt9"),
    (("--model", "gpt3", "--size", "17x"), "17x"),
    (("--gpu", "z100", "--nodes", "4", "--days", "10", "--tokens", "300b"), "z100"),
    (BUDGET + ("--nodes", "0"), "--nodes 0"),
    (BUDGET + ("--nodes", "-2"), "--nodes -2"),
    (("--gpu", "a100-80gb", "--nodes", "4", "--days", "0", "--tokens", "300b"), "--days 0"),
    (("--gpu", "a100-80gb", "--nodes", "4", "--days", "-5", "--tokens", "300b"), "--days -5"),
    (BUDGET + ("--gpus", "12"), "12"),
    (("--gpu", "a100-80gb", "--nodes", "4", "--days", "10", "--tokens", "lots"), "lots"),
    (("--gpu", "a100-80gb", "--nodes", "4", "--days", "10"), "--tokens"),
    (("--gpu", "a100-80gb", "--tokens", "300b"), "--nodes"),
    (BUDGET + ("--nodes", "4", "--mfu", "1.5"), "--mfu"),
    (BUDGET + ("--nodes", "4", "--precision", "fp8"), "fp8"),
])
def test_bad_input_is_one_line_exit_2(args, names):
    """Through ``autoconfig.cli.main`` in-process (fast); one case below as a subprocess."""
    code, stdout, stderr = invoke_main("base", *args)
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert names in lines[0]
    assert "Traceback" not in stderr and stdout == ""



@pytest.mark.parametrize("args, message", [
    (BUDGET + ("--nodes", "0"), "invalid --nodes 0: must be a whole number in [1, 1048576]"),
    (BUDGET + ("--nodes", "2000000"),
     "invalid --nodes 2000000: must be a whole number in [1, 1048576]"),
    (("--size", "1.3b", "--gpus-per-node", "0"),
     "invalid --gpus-per-node 0: must be a whole number in [1, 1048576]"),
    (BUDGET + ("--gpus", "16", "--gpus-per-node", "-8"),
     "invalid --gpus-per-node -8: must be a whole number in [1, 1048576]"),
    (("--size", "1.3b", "--gpus-per-node", "2000000"),
     "invalid --gpus-per-node 2000000: must be a whole number in [1, 1048576]"),
    (("--gpu", "a100-80gb", "--nodes", "4", "--days", "0", "--tokens", "300b"),
     "invalid --days 0: must be greater than 0 and finite"),
    (("--size", "1.3b", "--seq-len", "0"),
     "invalid --seq-len 0: must be a whole number in [1, 16777216]"),
    (("--size", "1.3b", "--tflops-per-gpu", "-1"),
     "invalid --tflops-per-gpu -1: must be greater than 0 and finite"),
    (("--size", "1.3b", "--gpu", "h100", "--nodes", "1", "--tflops-per-gpu", "5000"),
     "invalid --tflops-per-gpu 5000: must be in (0, 989], the bf16 peak of h100-80gb"),
])
def test_range_errors_share_the_bounds_message_form(args, message):
    code, _, stderr = invoke_main("base", *args)
    assert code == 2 and stderr == f"error: {message}\n"


def test_mfu_out_of_range_is_refused_by_the_request_and_by_compute_rate():
    """The request check holds --mfu with or without a GPU; compute_rate, which a
    Python caller may reach directly, refuses it too instead of using it."""
    from autoconfig.base import budget
    from autoconfig.core.catalog import get_gpu

    code, _, stderr = invoke_main("base", "--size", "1.3b", "--mfu", "2")
    assert code != 0 and "invalid --mfu 2: must be in (0, 1]" in stderr
    with pytest.raises(InputError, match=r"invalid --mfu 2: must be in \(0, 1\]"):
        budget.compute_rate(get_gpu("h100"), 8, "bf16", False, 2.0, None)


def test_bad_input_in_a_real_process():
    proc = run("--model", "gpt3", "--size", "17x")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "'17x'" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_help_lists_both_modes():
    proc = run("--help")
    assert proc.returncode == 0
    assert "--size" in proc.stdout and "--days" in proc.stdout and "--gpus" in proc.stdout


def test_base_yaml_carries_the_stack_that_search_predicts_with(tmp_path) -> None:
    """`autoconfig base --stack nemo -o base.yaml`, then `search --base base.yaml`:
    the search predicts with the nemo stack and the launch files set its flags."""
    import subprocess
    import sys
    base = tmp_path / "base.yaml"
    run = [sys.executable, "-m", "autoconfig"]
    made = subprocess.run(run + ["base", "--model", "llama3", "--size", "8b", "--gpu", "h100",
                                 "--nodes", "2", "--stack", "nemo", "-o", str(base)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert read_base_yaml(base).stack == "nemo"
    out = tmp_path / "s"
    searched = subprocess.run(run + ["search", "--base", str(base), "--top", "1", "--no-plots",
                                     "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert searched.returncode == 0, searched.stderr
    assert "stack nemo" in searched.stdout.splitlines()[0]
    assert "--tp-comm-overlap" in (out / "megatron_args.sh").read_text()
