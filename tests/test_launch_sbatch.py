"""launch.sbatch: shellcheck-clean, the right SLURM request, and a real run.

The slow test renders the SAME template users get, with the project's own
profiling worker (CPU, gloo, the tiny model) as the program instead of
pretrain_gpt.py, submits it to the real single-node SLURM
(scripts/slurm-localhost.sh) with 2 tasks, and checks that the two ranks found
each other through the script's rendezvous and finished a training step.
"""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import Plan, Workload
from autoconfig.launch.megatron_lm import megatron_args_script
from autoconfig.launch.sbatch import environment, render_sbatch
from autoconfig.launch.spec import SlurmSettings, launch_spec
from autoconfig.profiling.spec import ProfileSpec
from autoconfig.training.stack import with_overrides
from launch_cases import ALL_CASES, T5_CASES, case_spec

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "slurm-localhost.sh"
SLURM_DIR = os.environ.get("AUTOCONFIG_SLURM_DIR", "/tmp/autoconfig-slurm")


def _shellcheck() -> str:
    path = shutil.which("shellcheck")
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("shellcheck is not installed in CI (apt-get install -y shellcheck)")
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
    return path


def _check(path: Path) -> None:
    proc = subprocess.run([_shellcheck(), "--severity=style", str(path)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", sorted(ALL_CASES) + sorted(T5_CASES))
def test_scripts_pass_shellcheck(name, tmp_path):
    spec = case_spec(name)
    files = {"launch.sbatch": render_sbatch(spec),
             "megatron_args.sh": megatron_args_script(spec),
             "launch_bridge.sbatch": render_sbatch(spec, ["python", "bridge_recipe.py"], [])}
    for file_name, text in files.items():
        (tmp_path / file_name).write_text(text)
        _check(tmp_path / file_name)


def test_sbatch_requests_the_cluster_and_options(tmp_path):
    spec = case_spec("llama3-70b-bf16-vp-full-block")
    spec = launch_spec(spec.model, spec.workload, spec.plan, spec.cluster, software=spec.software,
                       stack=spec.stack,
                       slurm=SlurmSettings(partition="gpu", account="proj", qos="high",
                                           time_limit_min=90, container_image="nvcr.io/x:1"))
    text = render_sbatch(spec)
    for line in ("#SBATCH --nodes=64", "#SBATCH --ntasks-per-node=8",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --time=01:30:00",
                 "#SBATCH --partition=gpu", "#SBATCH --account=proj", "#SBATCH --qos=high",
                 'CONTAINER_IMAGE="${CONTAINER_IMAGE:-nvcr.io/x:1}"',
                 "export CUDA_DEVICE_MAX_CONNECTIONS=1", "export NCCL_P2P_NET_CHUNKSIZE=2097152",
                 # the allocator the memory model's fragmentation factor assumes
                 "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)'):
        assert line in text, line
    # the megatron_args.sh arrays are the sbatch's, byte for byte
    arrays = megatron_args_script(spec).split("disable=SC2034  # used by whoever sources this\n")[1]
    assert arrays in text
    (tmp_path / "launch.sbatch").write_text(text)
    _check(tmp_path / "launch.sbatch")


def test_plain_plan_without_options_has_no_empty_directives():
    text = render_sbatch(case_spec("llama3-8b-bf16-plain"))
    assert "--partition" not in text and "--time" not in text
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=8" in text   # TP = CP = 1 (Bridge overrides)


def test_megatron_fsdp_keeps_several_hardware_queues():
    """Megatron-LM asserts CUDA_DEVICE_MAX_CONNECTIONS != 1 with Megatron-FSDP, where a
    TP/CP plan on Hopper otherwise gets 1."""
    spec = case_spec("llama3-8b-fp8-cp")                      # H100, TP 2, CP 2
    assert dict((n, v) for n, v, _ in environment(spec))["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    sharded = dataclasses.replace(spec, software=with_overrides(spec.software,
                                                                fsdp_sharding="full-shard"))
    assert sharded.software.megatron_fsdp
    assert dict((n, v) for n, v, _ in environment(sharded))["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"


def test_moe_environment_follows_the_dispatcher_and_overlap():
    """Bridge's rules: HybridEP gets its ranks per NVLink domain and more hardware
    queues; EP A2A overlap keeps more than one queue even with TP > 1."""
    hybridep = render_sbatch(case_spec("deepseek-v3-ep64-pp8-hybridep"))
    assert "export NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8" in hybridep
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in hybridep   # TP 2, no A2A overlap
    a2a = render_sbatch(case_spec("deepseek-v3-ep16-pp3-vp3-a2a"))
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=8" in a2a and "HYBRID_EP" not in a2a


# ------------------------------------------------------------ real SLURM


@pytest.fixture(scope="module")
def slurm():
    """The shared single-node SLURM, started if needed (never stopped: others use it)."""
    env = dict(os.environ, AUTOCONFIG_SLURM_DIR=SLURM_DIR)
    try:
        proc = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True,
                              timeout=300, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        proc = None
        reason = str(exc)
    if proc is None or proc.returncode != 0:
        reason = reason if proc is None else proc.stderr.strip()[-300:]
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"cannot start a local SLURM in CI: {reason}")
        pytest.skip(f"cannot start a local SLURM: {reason}")
    return dict(os.environ, SLURM_CONF=f"{SLURM_DIR}/etc/slurm.conf")


@pytest.mark.slow
def test_sbatch_template_runs_two_ranks_on_slurm(slurm, tmp_path):
    plan = Plan(tp=1, pp=1, dp=2)
    tiny, workload = get_model("tiny"), Workload(8, 128)
    spec = launch_spec(tiny, workload, plan, Cluster(get_gpu("h100-80gb"), 1, 2),
                       slurm=SlurmSettings(job_name="ac-launch-test", time_limit_min=5,
                                           request_gpus=False))
    worker = ProfileSpec(model=tiny, workload=workload, plan=plan, device="cpu",
                         warmup_steps=1, timed_steps=1)
    results = tmp_path / "results"
    results.mkdir()
    script = tmp_path / "launch.sbatch"
    script.write_text(render_sbatch(spec, [sys.executable, "-m", "autoconfig.profiling.worker"],
                                    ["--spec-json", worker.to_json(),
                                     "--result-dir", str(results)]))
    _check(script)
    env = dict(slurm, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    start = time.monotonic()
    proc = subprocess.run(["sbatch", "--wait", "--parsable", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=400)
    elapsed = time.monotonic() - start
    logs = "\n".join(p.read_text(errors="replace") for p in tmp_path.glob("*.out"))
    assert proc.returncode == 0, f"{proc.stdout}{proc.stderr}\n{logs}"
    record = json.loads((results / "result-rank0.json").read_text())
    assert record["status"] == "ok", record.get("error")
    assert record["world_size"] == 2 and record["device"] == "cpu"
    assert not (results / "result-rank1.json").exists()   # rank 1 finished without failure
    print(f"sbatch --wait of 2 ranks: {elapsed:.1f} s")


@pytest.mark.parametrize("data", ["mock", "real"])
def test_sourced_arguments_are_the_rendered_ones(data, tmp_path):
    """bash reads megatron_args.sh into exactly megatron_args(spec) (placeholders expanded)."""
    from autoconfig.launch.megatron_lm import megatron_args
    spec = case_spec("gpt3-175b-bf16-vp-selective")
    script = tmp_path / "megatron_args.sh"
    script.write_text(megatron_args_script(spec))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "DATA_PATH": "/d/text",
           "VOCAB_FILE": "/d/vocab.json", "MERGE_FILE": "/d/merges.txt",
           "CHECKPOINT_DIR": "/ck", "LOG_DIR": "/logs", "MOCK_DATA": "1" if data == "mock" else "0"}
    proc = subprocess.run(["bash", "-c", f'source {script} && printf "%s\\n" "${{MEGATRON_ARGS[@]}}"'],
                          capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    expected = [a.replace("$DATA_PATH", "/d/text").replace("$VOCAB_FILE", "/d/vocab.json")
                .replace("$MERGE_FILE", "/d/merges.txt").replace("$CHECKPOINT_DIR", "/ck")
                .replace("$LOG_DIR", "/logs") for a in megatron_args(spec, data)]
    assert proc.stdout.splitlines() == expected


def test_real_data_without_data_path_stops_with_a_message(tmp_path):
    script = tmp_path / "megatron_args.sh"
    script.write_text(megatron_args_script(case_spec("llama3-8b-bf16-plain")))
    proc = subprocess.run(["bash", "-c", f"source {script}"], capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd=tmp_path)
    assert proc.returncode != 0 and "set DATA_PATH" in proc.stderr
