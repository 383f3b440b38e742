"""`autoconfig search` and `autoconfig estimate` through the real CLI."""

import json
import subprocess
import sys

import pytest
import yaml

from cli_runner import run_cli


def test_search_end_to_end_writes_every_file(tmp_path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "search", "--model", "gpt3",
                           "--size", "175b", "--nodes", "128", "--gbs", "1536", "--top", "5",
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for header in ("TP", "PP", "VP", "CP", "DP", "SP", "MBS", "recompute", "dist-opt",
                   "step s", "tok/s/GPU", "TFLOP/s/GPU", "MFU %", "mem GiB/GPU"):
        assert header in proc.stdout
    assert "considered" in proc.stdout and "exceeds memory" in proc.stdout
    names = {p.name for p in out.iterdir()}
    assert names == {"plans.csv", "report.md", "best.yaml", "best.json", "megatron_args.sh",
                     "launch.sbatch", "bridge_recipe.py", "launch_bridge.sbatch",
                     "nemo_overrides.txt", "plans_throughput_vs_memory.png",
                     "best_breakdown.png"}
    best = yaml.safe_load((out / "best.yaml").read_text())
    command = (out / "megatron_args.sh").read_text()
    assert f"--tensor-model-parallel-size {best['plan']['tp']}" in command
    nemo = (out / "nemo_overrides.txt").read_text()
    assert "trainer.num_nodes=128" in nemo
    assert f"model.pipeline_model_parallel_size={best['plan']['pp']}" in nemo
    assert len((out / "plans.csv").read_text().splitlines()) > 100
    assert "hyper-parameters from autoconfig base defaults for gpt3-175b" in proc.stdout


def test_search_json_with_base_reaches_every_target(tmp_path) -> None:
    """--base base.yaml: its LR, schedule, init and tokens in every target; --format json."""
    base = tmp_path / "base.yaml"
    made = subprocess.run([sys.executable, "-m", "autoconfig", "base", "--model", "llama3",
                           "--size", "8b", "--tokens", "300b", "-o", str(base)],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    cfg = yaml.safe_load(base.read_text())
    opt, training = cfg["optimizer"], cfg["training"]
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "search", "--base", str(base),
                           "--gpu", "h100", "--nodes", "2", "--top", "3", "--format", "json",
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert json.loads((out / "best.json").read_text()) == data["best"]
    assert data["feasible"] >= 1 and len(data["top"]) <= 3
    launch = data["best"]["launch"]
    assert launch["hyperparameters"]["source"] == f"base config {base}"
    args = launch["megatron_args"]
    gbs = training["global_batch_size"]
    assert float(args[args.index("--lr") + 1]) == pytest.approx(opt["lr"], rel=1e-5)
    assert float(args[args.index("--min-lr") + 1]) == pytest.approx(opt["min_lr"], rel=1e-5)
    assert int(args[args.index("--train-samples") + 1]) == training["train_steps"] * gbs
    assert int(args[args.index("--lr-warmup-samples") + 1]) == opt["lr_warmup_steps"] * gbs
    assert float(args[args.index("--init-method-std") + 1]) == pytest.approx(
        opt["init_method_std"], rel=1e-5)
    assert "--rotary-base" in args and args[args.index("--rotary-base") + 1] == "500000"
    assert f"model.optim.lr={opt['lr']:.6g}" in launch["nemo1_overrides"]
    assert launch["bridge"]["fields"]["optimizer.lr"] == pytest.approx(opt["lr"], rel=1e-5)
    sbatch = (out / "launch.sbatch").read_text()
    assert f"--lr {opt['lr']:.6g}" in sbatch
    assert f"cfg.optimizer.lr = {opt['lr']:.6g}" in (out / "bridge_recipe.py").read_text()


def test_estimate_json_gpt3_175b(capsys) -> None:
    code, out, err = run_cli(["estimate", "--model", "gpt3", "--size", "175b", "--gpu",
                              "a100-80gb", "--gpus", "1024", "--tp", "8", "--pp", "8", "--vp",
                              "1", "--cp", "1", "--mbs", "1", "--gbs", "1536", "--seq-len",
                              "2048", "--recompute", "selective", "--sp",
                              "--distributed-optimizer", "--format", "json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    for key in ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu", "memory_gib",
                "memory_breakdown_gib", "fits", "time_breakdown_s"):
        assert key in data
    assert data["plan"]["dp"] == 16 and data["fits"] is True
    assert 0 < data["mfu"] < 1
    # tokens/s/GPU and step time describe the same step.
    assert data["tokens_per_s_per_gpu"] == pytest.approx(
        1536 * 2048 / data["step_time_s"] / 1024, rel=1e-6)
    assert data["memory_gib"] == pytest.approx(sum(data["memory_breakdown_gib"].values()),
                                               rel=1e-6)


def test_estimate_json_llama_shape_on_h100(capsys) -> None:
    code, out, err = run_cli(["estimate", "--layers", "32", "--hidden", "4096", "--heads", "32",
                              "--kv-heads", "8", "--ffn", "14336", "--vocab", "128256",
                              "--swiglu", "--gpu", "h100", "--gpus", "64", "--tp", "2",
                              "--mbs", "1", "--gbs", "512", "--seq-len", "8192", "--recompute",
                              "selective", "--sp", "--distributed-optimizer", "--format", "json"],
                             capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["gpu"] == "h100-80gb" and data["plan"]["dp"] == 32
    assert data["step_time_s"] > 0 and isinstance(data["fits"], bool)


@pytest.mark.parametrize("args, named", [
    (["--gbs", "1000"], "1000"),
    (["--gbs", "1536", "--tp", "128"], "128"),
    (["--gbs", "1536", "--gpu", "z100"], "z100"),
    (["--gbs", "1536", "--gpus", "1020"], "1020"),
])
def test_estimate_bad_input_is_one_line(capsys, args, named) -> None:
    base = ["estimate", "--model", "gpt3", "--size", "175b", "--tp", "8", "--pp", "8"]
    if "--gpus" not in args:
        base += ["--gpus", "1024"]
    code, out, err = run_cli(base + args, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("error:")
    assert named in err and "Traceback" not in err + out


def test_search_nothing_fits_exits_2_with_suggestion(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "search", "--model", "gpt3",
                           "--size", "175b", "--nodes", "1", "--gbs", "1536", "-o",
                           str(tmp_path / "x")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "no plan fits" in proc.stderr and "--nodes" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("args, named", [
    (["--tp", "7"], "tp 7"),
    (["--recompute", "sometimes"], "sometimes"),
    (["--gpu", "z100"], "z100"),
    (["--pp", "x"], "'x'"),
])
def test_search_bad_input_is_one_line(capsys, tmp_path, args, named) -> None:
    code, out, err = run_cli(["search", "--model", "gpt3", "--size", "13b", "--nodes", "2",
                              "--gbs", "256", "-o", str(tmp_path)] + args, capsys)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and named in err
    assert "Traceback" not in err + out


def test_search_from_base_yaml_uses_its_model_and_batch(capsys, tmp_path) -> None:
    base = tmp_path / "base.yaml"
    code, _, err = run_cli(["base", "--model", "gpt3", "--size", "13b", "--nodes", "2",
                            "--gpu", "a100-80gb", "-o", str(base)], capsys)
    assert code == 0, err
    from autoconfig.base.config import read_base_yaml
    expected = read_base_yaml(base)
    code, out, err = run_cli(["search", "--base", str(base), "--top", "3", "-o",
                              str(tmp_path / "out")], capsys)
    assert code == 0, err
    best = yaml.safe_load((tmp_path / "out" / "best.yaml").read_text())
    assert best["model"]["num_layers"] == 40 and best["cluster"]["nodes"] == 2
    assert best["workload"]["global_batch_size"] == expected.global_batch_size
    assert best["workload"]["seq_len"] == expected.seq_len


def test_llama3_405b_on_16k_h100_finds_plans_including_metas_layout(tmp_path, capsys) -> None:
    """`search --model llama3 --size 405b --gpu h100 --nodes 2048 --seq-len 8192 --gbs 2048`
    said nothing fits (126 layers: PP 16 was impossible); Meta trained it with TP 8,
    CP 1, PP 16 and uneven stages, which must be among the valid plans."""
    import pandas as pd
    code, out, err = run_cli(["search", "--model", "llama3", "--size", "405b", "--gpu", "h100",
                              "--nodes", "2048", "--seq-len", "8192", "--gbs", "2048",
                              "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    table = pd.read_csv(tmp_path / "plans.csv")
    meta = table[(table.tp == 8) & (table.cp == 1) & (table.pp == 16)]
    assert len(meta) > 0
    assert set(zip(meta.first_stage_layers, meta.last_stage_layers)) == {(7, 7)}
