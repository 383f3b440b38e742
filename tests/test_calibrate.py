"""Calibration from measurements (issue 18): the replay executor answers
profiling jobs from a table, ``calibrate`` refits the constants on what was
measured, and ``--calibration`` makes estimate/search/capacity predict exactly
what the fitted constants say; a file for another GPU, from the CPU proxy or
for another model version is refused in one line."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import PLAN_FIELDS, Plan, PlanTable, Workload
from autoconfig.profiling import calibrate, store
from autoconfig.training.step_time import load_constants, step_time
from autoconfig.training.stack import load_stack
from autoconfig.validation.calibration import with_values
from tests.cli_runner import run_cli

SETTING = ["--model", "llama3-8b", "--gpu", "h100", "--gbs", "64", "--seq-len", "2048"]
SLOWER = 1.25
"""The replayed cluster runs every plan this much slower than predicted (+-3% noise)."""


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A replayed profiling search: a table measuring every plan of the grid."""
    root = tmp_path_factory.mktemp("replay")
    code, _, err = _cli([*SETTING, "--nodes", "1", "--no-plots", "-o", str(root / "grid")])
    assert code == 0, err
    grid = pd.read_csv(root / "grid" / "plans.csv")
    table = grid[[c for c in PLAN_FIELDS if c in grid.columns]].copy()
    table["recompute_modules"] = table["recompute_modules"].astype(str).replace("nan", "")
    noise = np.random.default_rng(7).uniform(0.97, 1.03, len(grid))
    table["step_time_s"] = grid["step_time_s"] * SLOWER * noise
    table.head(60).to_csv(root / "measured.csv", index=False)   # the rest: not measurable
    code, out, err = _cli([*SETTING, "--nodes", "1", "--no-plots", "-o", str(root / "run"),
                           "--profile", "--executor", "replay", "--measurements",
                           str(root / "measured.csv"), "--top-k", "6"])
    assert code == 0, err
    return root


def _cli(args):
    import contextlib
    import io
    from autoconfig.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["search", *args] if args[0].startswith("--") else args)
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def test_replay_answers_from_the_table_and_says_what_it_cannot(profiled):
    records = store.latest_records(profiled / "run" / "profile")
    statuses = {r["status"] for r in records}
    assert "ok" in statuses
    for r in records:
        if r["status"] == "ok":
            assert r["device"] == "cuda" and r["tokens_per_s_per_gpu"] > 0
        else:
            assert r["status"] == "error" and "not measurable" in r["error"]


def test_calibrate_moves_the_constants_towards_the_measurements(profiled, capsys):
    out = profiled / "cal.yaml"
    code, text, err = run_cli(["calibrate", str(profiled / "run"), "-o", str(out)], capsys)
    assert code == 0, err
    cal = calibrate.read_calibration(out)
    assert cal.gpu == "h100-80gb" and cal.device == "cuda" and cal.records
    # the cluster is 25% slower than predicted: the GEMM efficiency drops, the error shrinks
    key = ("gemm_efficiency_max", "hopper")
    assert cal.values[key] < cal.defaults[key]
    assert cal.after_pct < cal.before_pct / 2
    assert "calibrated" in text and str(out) in text


def test_estimate_with_a_calibration_predicts_what_the_constants_say(profiled, capsys):
    path = profiled / "cal-estimate.yaml"
    assert run_cli(["calibrate", str(profiled / "run" / "profile"), "-o", str(path)],
                   capsys)[0] == 0
    args = ["estimate", *SETTING, "--gpus", "8", "--tp", "2", "--mbs", "4", "--sp",
            "--distributed-optimizer", "--format", "json"]
    code, plain, _ = run_cli(args, capsys)
    code2, calibrated, _ = run_cli([*args, "--calibration", str(path)], capsys)
    assert code == code2 == 0
    plain, calibrated = json.loads(plain), json.loads(calibrated)
    constants = with_values(load_constants(), calibrate.read_calibration(path).values)
    plan = Plan(tp=2, pp=1, dp=4, sp=True, mbs=4, distributed_optimizer=True)
    expected = step_time(get_model("llama3-8b"), Workload(64, 2048), PlanTable.from_plans([plan]),
                         Cluster(get_gpu("h100"), 1, 8), constants=constants,
                         software=load_stack("megatron-lm").features).step_time_s[0]
    assert calibrated["step_time_s"] == pytest.approx(float(expected), rel=1e-12)
    assert calibrated["step_time_s"] > plain["step_time_s"]
    assert "calibrated by" in calibrated["calibration"]
    # search and capacity say they used it
    code, text, _ = run_cli(["search", *SETTING, "--nodes", "1", "--no-plots", "-o",
                             str(profiled / "s"), "--calibration", str(path)], capsys)
    assert code == 0 and "calibrated by" in text
    code, text, _ = run_cli(["capacity", "--model", "llama3-8b", "--gpu", "h100,a100-80gb",
                             "--nodes", "1", "--no-plots", "-o", str(profiled / "c"),
                             "--calibration", str(path)], capsys)
    assert code == 0 and "calibrated by" in text


def _variant(profiled, tmp_path, **changes) -> Path:
    source = profiled / "cal-variant.yaml"
    if not source.exists():
        calibrate.write_calibration(source, calibrate.calibrate(
            calibrate.measured_runs([profiled / "run" / "profile"])))
    data = yaml.safe_load(source.read_text())
    data.update(changes)
    path = tmp_path / "variant.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("changes, message", [
    ({"device": "cpu"}, "CPU-proxy measurements"),
    ({"gpu": "a100-80gb"}, "fitted on a100-80gb, not h100-80gb"),
    ({"model_fingerprint": "0" * 64}, "another version of the model"),
    ({"kind": "something"}, "invalid calibration file"),
])
def test_a_calibration_that_does_not_apply_is_refused_in_one_line(profiled, tmp_path, capsys,
                                                                  changes, message):
    path = _variant(profiled, tmp_path, **changes)
    code, _, err = run_cli(["estimate", *SETTING, "--gpus", "8", "--calibration", str(path)],
                           capsys)
    assert code == 2 and err.count("\n") == 1 and message in err


def _cpu_store(folder: Path, model_name: str, workload: Workload, gpus: int) -> Path:
    """A results folder with one ok record measured on the CPU proxy."""
    plan = Plan(tp=1, pp=1, dp=gpus)
    store.write_plans(folder, pd.DataFrame([plan.to_dict()]), {
        "model": dataclasses.asdict(get_model(model_name)),
        "workload": dataclasses.asdict(workload),
        "cluster": {"gpu": "h100-80gb", "nodes": 1, "gpus_per_node": gpus}, "device": "cpu"})
    store.append_record(folder, {**plan.to_dict(), "status": "ok", "device": "cpu",
                                 "step_time_s": 0.5, "iteration_times_s": [0.5]})
    return folder


def test_cpu_proxy_records_calibrate_nothing_on_gpus(tmp_path):
    """A store whose records ran on the CPU proxy gives a cpu calibration."""
    folder = _cpu_store(tmp_path / "profile", "tiny", Workload(8, 128), 1)
    cal = calibrate.calibrate(calibrate.measured_runs([folder]))
    assert cal.device == "cpu"
    path = calibrate.write_calibration(tmp_path / "cpu.yaml", cal)
    with pytest.raises(Exception, match="CPU-proxy"):
        calibrate.constants_for(path, "h100-80gb")


# ---------------------------------------------------------------- rounds


@pytest.fixture(scope="module")
def skewed(profiled):
    """A table of every plan in which TP costs more than the model thinks."""
    grid = pd.read_csv(profiled / "grid" / "plans.csv")
    table = grid[[c for c in PLAN_FIELDS if c in grid.columns]].copy()
    table["recompute_modules"] = table["recompute_modules"].astype(str).replace("nan", "")
    noise = np.random.default_rng(11).uniform(0.98, 1.02, len(grid))
    table["step_time_s"] = grid["step_time_s"] * (1.1 + 0.05 * np.log2(grid["tp"])) * noise
    path = profiled / "skewed.csv"
    table.to_csv(path, index=False)
    return path, float(table["step_time_s"].min())


def _rounds(out, measurements, max_runs, *extra):
    return _cli([*SETTING, "--nodes", "1", "--no-plots", "-o", str(out), "--profile",
                 "--executor", "replay", "--measurements", str(measurements), "--top-k", "3",
                 "--max-runs", str(max_runs), *extra])


def test_rounds_find_the_measured_best_within_the_budget(profiled, skewed, tmp_path):
    from autoconfig.profiling.rounds import load_rounds
    table, true_best = skewed
    code, out, err = _rounds(tmp_path / "r", table, 8)
    assert code == 0, err
    results = tmp_path / "r" / "profile"
    latest = store.load_results(results)
    assert len(latest) <= 8
    assert latest["step_time_s"].min() <= true_best * 1.02
    rounds = load_rounds(results)
    assert rounds[0]["constants"] == {}                       # round 1 ranks with shipped
    assert any(r["constants"] for r in rounds if r.get("planned"))  # later rounds calibrated
    assert rounds[-1]["stopped"] and "[profile] round 2" in err
    assert (results / "calibration.yaml").is_file()
    assert "## Rounds" in (results / "profile_report.md").read_text()
    # the launch files are for the measured winner
    winner = store.plan_from_record(latest.sort_values("step_time_s").iloc[0].to_dict())
    args = (tmp_path / "r" / "megatron_args.sh").read_text()
    assert f"--tensor-model-parallel-size {winner.tp}\n" in args
    assert f"--micro-batch-size {winner.mbs}\n" in args
    assert ("--sequence-parallel" in args) == winner.sp
    best = yaml.safe_load((tmp_path / "r" / "best.yaml").read_text())
    assert best["chosen_by"] == "measurement"
    assert best["plan"]["tp"] == winner.tp and best["plan"]["mbs"] == winner.mbs
    assert best["measured"]["step_time_s"] == pytest.approx(latest["step_time_s"].min(),
                                                            rel=1e-3)


def test_rounds_resume_where_a_killed_loop_stopped(profiled, skewed, tmp_path, monkeypatch):
    from autoconfig.profiling import launch as launch_module
    from autoconfig.profiling.rounds import load_rounds
    table, _ = skewed
    real, calls = launch_module.launch, []

    def killed_in_round_2(items, *args, **kw):
        calls.append([i.plan for i in items])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(items, *args, **kw)
    monkeypatch.setattr(launch_module, "launch", killed_in_round_2)
    code, _, _ = _rounds(tmp_path / "r", table, 8)
    assert code == 130
    results = tmp_path / "r" / "profile"
    before = store.load_records(results)
    planned = [store.plan_from_record(p) for p in load_rounds(results)[-1]["planned"]]
    assert len(before) == 3 and planned == calls[1]
    monkeypatch.setattr(launch_module, "launch", real)
    code, _, err = _rounds(tmp_path / "r", table, 8)
    assert code == 0, err
    after = store.load_records(results)
    assert after[:3] == before                                 # nothing lost
    plans = [store.plan_from_record(r) for r in after]
    assert len(plans) == len(set(plans))                      # nothing measured twice
    assert set(planned) <= set(plans[3:6])                    # the killed round first


def test_a_sweep_uses_the_calibration_on_its_gpu_only(profiled, tmp_path, capsys):
    from autoconfig.sweep.run import run_sweep
    from autoconfig.sweep.spec import parse_sweep
    path = profiled / "cal-sweep.yaml"
    calibrate.write_calibration(path, calibrate.calibrate(
        calibrate.measured_runs([profiled / "run" / "profile"])))
    spec = parse_sweep({"name": "c", "matrix": {"model": [{"model": "llama3-8b"}],
                                                "gpu": ["h100", "a100-80gb"], "nodes": [1],
                                                "gbs": [64], "seq_len": [2048]}})
    calibrated, plain = run_sweep(spec, tmp_path / "cal", calibration=path)
    shipped = run_sweep(spec, tmp_path / "plain")
    assert calibrated["calibration"] == str(path) and "calibration" not in plain
    assert (calibrated["best"]["predicted"]["step_time_s"]
            > shipped[0]["best"]["predicted"]["step_time_s"])
    assert plain["best"] == shipped[1]["best"]


def test_infer_takes_the_calibration(profiled, tmp_path, capsys):
    path = profiled / "cal-infer.yaml"
    calibrate.write_calibration(path, calibrate.calibrate(
        calibrate.measured_runs([profiled / "run" / "profile"])))
    args = ["infer", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--input-len",
            "1024", "--output-len", "128", "--no-plots", "--format", "json", "-o"]
    code, plain, _ = run_cli([*args, str(tmp_path / "a")], capsys)
    code2, calibrated, err = run_cli([*args, str(tmp_path / "b"), "--calibration", str(path)],
                                     capsys)
    assert code == code2 == 0 and "calibrated by" in err
    assert plain != calibrated


def test_a_replay_table_may_give_tokens_per_second_instead(profiled, skewed, tmp_path):
    table, _ = skewed
    steps = pd.read_csv(table)
    rates = steps.drop(columns=["step_time_s"])
    rates["tokens_per_s_per_gpu"] = 64 * 2048 / (8 * steps["step_time_s"])
    path = tmp_path / "rates.csv"
    rates.to_csv(path, index=False)
    assert _rounds(tmp_path / "a", table, 4)[0] == 0
    assert _rounds(tmp_path / "b", path, 4)[0] == 0
    a = store.load_results(tmp_path / "a" / "profile").set_index("mbs")
    b = store.load_results(tmp_path / "b" / "profile").set_index("mbs")
    assert a["step_time_s"].to_numpy() == pytest.approx(b["step_time_s"].to_numpy(), rel=1e-12)


def test_a_profiled_sweep_setting_runs_in_rounds(profiled, skewed, tmp_path):
    from autoconfig.profiling.rounds import load_rounds
    from autoconfig.sweep.run import run_sweep
    from autoconfig.sweep.spec import parse_sweep
    table, true_best = skewed
    spec = parse_sweep({"name": "r", "matrix": {"model": [{"model": "llama3-8b"}],
                                                "gpu": ["h100"], "nodes": [1], "gbs": [64],
                                                "seq_len": [2048], "mode": ["profile"]},
                        "profile": {"executor": "replay", "measurements": str(table),
                                    "max_runs": 8, "top_k": 3}})
    [record] = run_sweep(spec, tmp_path)
    assert record["status"] == "ok", record["reason"]
    assert record["measured"]["step_time_s"] <= true_best * 1.02
    results = tmp_path / record["measured"]["profile_dir"]
    assert load_rounds(results)[-1]["stopped"]


def test_cpu_and_gpu_records_are_not_mixed(profiled, tmp_path):
    folder = _cpu_store(tmp_path / "profile", "llama3-8b", Workload(64, 2048), 8)
    with pytest.raises(Exception, match="CPU proxy and from GPUs"):
        calibrate.calibrate(calibrate.measured_runs([profiled / "run" / "profile", folder]))


def test_a_measurements_table_is_parsed_once_while_unchanged(tmp_path, monkeypatch):
    """The check before the search and the executor read one parse; an edited
    file is read again, and callers cannot change each other's rows."""
    import os
    from autoconfig.profiling.executors import replay
    path = tmp_path / "m.csv"
    path.write_text("tp,pp,dp,step_time_s\n1,1,8,2.0\n")
    calls = []
    real = replay._parse_measurements
    monkeypatch.setattr(replay, "_parse_measurements", lambda p: calls.append(p) or real(p))
    replay._parsed.cache_clear()
    first = replay.load_measurements(str(path))
    first[0]["record"]["step_time_s"] = 99.0
    assert replay.load_measurements(str(path))[0]["record"]["step_time_s"] == 2.0
    assert len(calls) == 1
    path.write_text("tp,pp,dp,step_time_s\n1,1,8,3.0\n")
    os.utime(path, ns=(1, 1))                 # a new modification time whatever the clock
    assert replay.load_measurements(str(path))[0]["record"]["step_time_s"] == 3.0
    assert len(calls) == 2
