"""Profiling with the local executor and the real megatron-core worker (CPU, tiny model)."""

import subprocess
import sys

import pandas as pd
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.cli import cli, main
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import Plan, Workload
from autoconfig.profiling import launch, store
from autoconfig.profiling.sweep import ProfileOptions, RankedPlan, run_profiling
from probe_jobs import probe_job
from profile_probe import probe_command
from autoconfig.profiling.launch import LaunchOptions

PLANS = [Plan(tp=1, pp=1, dp=2), Plan(tp=2, pp=1, dp=1, sp=True, recompute="full")]


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    out = tmp_path_factory.mktemp("search-out")
    model = get_model("tiny")
    cluster = Cluster(gpu=get_gpu("h100-80gb"), nodes=1, gpus_per_node=2)
    workload = Workload(global_batch_size=4, seq_len=model.seq_len)
    ranked = [RankedPlan(p, 0.01 * (i + 1), 1e5 / (i + 1), 1.0) for i, p in enumerate(PLANS)]
    options = ProfileOptions(profile=True, top_k=2, max_steps=1, warmup_steps=1,
                             launch=LaunchOptions(executor="local", device="cpu", time_limit_min=5,
                                                  max_parallel=2))
    lines = []
    results = run_profiling(ranked, model, workload, cluster, options, out,
                            echo=lambda text, err=False: lines.append(text))
    return results, lines, (ranked, model, workload, cluster, options, out)


@pytest.mark.slow
def test_two_plans_run_for_real_and_are_ranked(profiled):
    results, lines, _ = profiled
    records = store.load_records(results)
    assert sorted(store.plan_from_record(r) for r in records) == sorted(PLANS)
    for r in records:
        assert r["status"] == "ok", r["error"]
        assert r["executor"] == "local" and r["device"] == "cpu"
        assert r["world_size"] == 2 and r["step_time_s"] > 0 and len(r["losses"]) == 2
    # same seed, same data: plans that differ only in layout start from the same loss
    first = [r["losses"][0] for r in records]
    assert first[0] == pytest.approx(first[1], rel=1e-3)
    report = pd.read_csv(results / "profile_report.csv")
    assert sorted(report["measured_rank"]) == [1, 2]
    best = report[report["measured_rank"] == 1].iloc[0]
    assert best["tokens_per_s_per_gpu"] == max(r["tokens_per_s_per_gpu"] for r in records)
    text = "\n".join(lines)
    assert "not gpu figures" in text.lower() and "Measured ranking" in text


@pytest.mark.slow
def test_rerun_with_the_same_output_dir_skips_finished_plans(profiled):
    results, _, (ranked, model, workload, cluster, options, out) = profiled
    before = (results / store.RESULTS_FILE).read_text()
    lines = []
    run_profiling(ranked, model, workload, cluster, options, out,
                  echo=lambda text, err=False: lines.append(text))
    assert (results / store.RESULTS_FILE).read_text() == before
    assert any("2 plan(s) already have a final record" in line for line in lines)


@pytest.mark.slow
def test_report_command_rebuilds_the_report(profiled, tmp_path):
    results, _, _ = profiled
    (results / "profile_report.csv").unlink()
    (results / "profile_report.md").unlink()
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "report", str(results.parent),
                           "--objective", "latency"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "objective latency" in proc.stdout
    report = pd.read_csv(results / "profile_report.csv")
    ok = report.sort_values("measured_rank")
    assert list(ok["step_time_s"]) == sorted(ok["step_time_s"])


def test_report_command_on_a_folder_without_results_is_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "report", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and str(tmp_path) in proc.stderr
    assert "Traceback" not in proc.stderr


_probe_cmd = probe_command("profile-probe-local", Plan(tp=4, pp=2, dp=1), gpus_per_node=4, global_batch_size=8)


def test_plan_needing_more_ranks_than_local_is_exit_2_and_store_untouched(tmp_path, capsys):
    out = tmp_path / "out"
    cli.add_command(_probe_cmd)
    try:
        with pytest.raises(SystemExit) as exc:
            main(["profile-probe-local", "--profile", "--device", "cpu", "-o", str(out)])
    finally:
        cli.commands.pop("profile-probe-local", None)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.count("\n") == 1 and "needs 8 GPUs" in err and "has 4" in err
    assert not out.exists()


def test_local_cuda_jobs_get_disjoint_gpus(tmp_path):
    """Side-by-side local jobs must not share GPUs (CUDA_VISIBLE_DEVICES via submitit)."""
    plans = [Plan(tp=2, pp=1, dp=1), Plan(tp=1, pp=2, dp=1), Plan(tp=1, pp=1, dp=2)]
    items = [launch.JobItem(p, 2, probe_job, ("sleep", 2.0)) for p in plans]
    opts = launch.LaunchOptions(executor="local", device="cuda", gpus_per_node=4,
                                max_parallel=3, time_limit_min=2, poll_s=0.2)
    records = launch.launch(items, opts, tmp_path, progress=False)
    assert [r["status"] for r in records] == ["ok"] * 3
    seen = [r["visible_gpus"] for r in records]
    assert sorted(seen[:2]) == ["0,1", "2,3"]     # the first two ran side by side
    assert seen[2] in ("0,1", "2,3")              # the third waited for a free pair


def test_rendezvous_ports_stay_below_the_ephemeral_range():
    # Job 13258 (a local job's id) listened on 33258 and found it taken by a
    # neighbour's outgoing socket: Linux hands those out from 32768 up.
    low, high = launch.RENDEZVOUS_PORTS
    assert high <= 32768
    ports = [launch.rendezvous_port(j) for j in (0, 13258, 32767, "4242_3", 10**9 + 7)]
    assert all(low <= p < high for p in ports)
    assert launch.rendezvous_port(13258) != launch.rendezvous_port(13259)
    assert launch.rendezvous_port("4242_3") == launch.rendezvous_port(42423)
