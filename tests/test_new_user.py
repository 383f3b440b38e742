"""What a new user trips over, through the real CLI (issue "What a new user trips over")."""

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent

BLOCK_IMPORTS = textwrap.dedent("""
    # sitecustomize: this Python cannot import torch or megatron (a fresh install)
    import sys

    class _Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "megatron"):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Block())
""")

BROKEN_TORCH = textwrap.dedent("""
    # sitecustomize: torch is found but breaks when imported (a bad install)
    import importlib.abc
    import importlib.machinery
    import sys

    class _Broken(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise RuntimeError("this torch build is broken")

    class _Finder:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                return importlib.machinery.ModuleSpec(name, _Broken())
            return None

    sys.meta_path.insert(0, _Finder())
""")


def _autoconfig(args, tmp_path, sitecustomize=None, umask=None, timeout=300):
    path = [str(ROOT)]
    if sitecustomize:
        shim = tmp_path / "shim"
        shim.mkdir(exist_ok=True)
        (shim / "sitecustomize.py").write_text(sitecustomize)
        path.insert(0, str(shim))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return subprocess.run([sys.executable, "-m", "autoconfig", *args], capture_output=True,
                          text=True, env=env, timeout=timeout,
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


TINY = ["search", "--model", "tiny", "--gpus-per-node", "2", "--nodes", "1"]


def test_profile_without_torch_fails_up_front_with_the_install_command(tmp_path):
    out = tmp_path / "out"
    proc = _autoconfig([*TINY, "--profile", "--device", "cpu", "-o", str(out)], tmp_path,
                       sitecustomize=BLOCK_IMPORTS)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "pip install 'autoconfig[profile]'" in proc.stderr
    assert "torch" in proc.stderr and "--device cpu" not in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()                     # checked before the search, nothing launched


def test_infer_profile_without_torch_fails_up_front_too(tmp_path):
    out = tmp_path / "out"
    proc = _autoconfig(["infer", "--model", "gpt3", "--size", "1.3b", "--gpus", "8",
                        "--input-len", "16", "--output-len", "4", "--profile", "--device", "cpu",
                        "-o", str(out)], tmp_path, sitecustomize=BLOCK_IMPORTS)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "pip install 'autoconfig[profile]'" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()                     # checked before the search, nothing written


def test_profile_where_no_plan_succeeds_exits_non_zero_naming_the_cause(tmp_path):
    out = tmp_path / "out"
    proc = _autoconfig([*TINY, "--tp", "1", "--pp", "1", "--profile", "--device", "cpu",
                        "--top-k", "1", "--max-minutes", "2", "-o", str(out)], tmp_path,
                       sitecustomize=BROKEN_TORCH)
    assert proc.returncode not in (0, None), proc.stdout[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: no profiled plan succeeded") and "broken" in last, proc.stderr
    assert "--device cpu" not in last           # the device was already cpu
    assert (out / "profile" / "results.jsonl").exists()


def test_output_files_take_the_umask_and_scripts_are_executable(tmp_path):
    out = tmp_path / "out"
    proc = _autoconfig([*TINY, "-o", str(out)], tmp_path, umask=0o022)
    assert proc.returncode == 0, proc.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files
    for path in files:
        mode = stat.S_IMODE(path.stat().st_mode)
        want = 0o755 if path.suffix in (".sh", ".sbatch") else 0o644
        assert mode == want, f"{path.name}: {oct(mode)}"
    assert (out / "megatron_args.sh").exists()


def test_report_refuses_a_folder_that_is_not_a_results_folder(tmp_path):
    out = tmp_path / "out"
    assert _autoconfig([*TINY, "-o", str(out)], tmp_path).returncode == 0
    before = sorted(p.name for p in out.iterdir())
    proc = _autoconfig(["report", str(out)], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "results.jsonl" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == before     # nothing written


def test_catalog_without_a_kind_is_one_line_listing_the_kinds(tmp_path):
    proc = _autoconfig(["catalog"], tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "gpus|models" in proc.stderr, proc.stderr


def test_summary_separates_never_valid_layouts_from_memory_rejections(tmp_path):
    out = tmp_path / "out"
    proc = _autoconfig(["search", "--model", "llama3-8b", "--gpu", "a100-80gb", "--nodes", "1",
                        "--gpus-per-node", "8", "-o", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    report = (out / "report.md").read_text()
    for text in (proc.stdout, report):
        assert "never valid (layout rules)" in text and "rejected for memory" in text
        assert "never valid: dp not integral" in text
        assert "rejected for memory: exceeds memory" in text


def test_best_yaml_leaves_out_fields_that_do_not_apply(tmp_path):
    import yaml

    out = tmp_path / "out"
    proc = _autoconfig([*TINY, "--recompute", "none", "--vp", "1", "-o", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    plan = yaml.safe_load((out / "best.yaml").read_text())["plan"]
    assert plan["recompute"] == "none"
    assert "recompute_method" not in plan and "recompute_num_layers" not in plan
    assert "vp" not in plan


def test_search_estimate_and_capacity_accept_gpus_or_nodes_alike(tmp_path):
    """`search --gpus` was "No such option" while `estimate` required `--gpus`."""
    by_gpus = _autoconfig(["search", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "16",
                           "--top", "1", "--no-plots", "-o", str(tmp_path / "a")], tmp_path)
    by_nodes = _autoconfig(["search", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "2",
                            "--top", "1", "--no-plots", "-o", str(tmp_path / "b")], tmp_path)
    assert by_gpus.returncode == 0 and by_nodes.returncode == 0, by_gpus.stderr
    assert by_gpus.stdout.splitlines()[0] == by_nodes.stdout.splitlines()[0]
    est = _autoconfig(["estimate", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "2",
                       "--gbs", "128", "--format", "json"], tmp_path)
    assert est.returncode == 0 and '"gpus": 16' in est.stdout
    cap = _autoconfig(["capacity", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "16",
                       "--no-plots", "-o", str(tmp_path / "c")], tmp_path)
    assert cap.returncode == 0, cap.stderr
    bad = _autoconfig(["capacity", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "12",
                       "--no-plots", "-o", str(tmp_path / "d")], tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0
    assert "12" in bad.stderr and "8-GPU nodes" in bad.stderr


def test_context_parallel_is_costed_so_cp_sizes_do_not_tie(tmp_path):
    """Llama 3 8B on 2 nodes: CP 1, 2 and 4 came out with identical step times and
    cp_comm exactly 0; the ring's per-step merging now costs time that grows with CP."""
    out = tmp_path / "s"
    run = _autoconfig(["search", "--model", "llama3-8b", "--gpu", "h100", "--nodes", "2",
                       "--tp", "1", "--pp", "1", "--mbs", "1",
                       "--cp", "1,2,4", "--no-plots", "-o", str(out)], tmp_path)
    assert run.returncode == 0, run.stderr
    import pandas as pd
    table = pd.read_csv(out / "plans.csv")
    table = table[table.distributed_optimizer]
    step = {int(cp): float(t.step_time_s.min()) for cp, t in table.groupby("cp")}
    cp_comm = {int(cp): float(t.cp_comm_s.min()) for cp, t in table.groupby("cp")}
    assert cp_comm[1] == 0 and 0 < cp_comm[2] < cp_comm[4]
    assert len(set(step.values())) == 3
