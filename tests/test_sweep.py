"""autoconfig sweep: validation, the nightly example end to end, failures
recorded, resume, exit status."""

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from autoconfig.errors import InputError
from autoconfig.sweep.run import SETTINGS_DIR, run_sweep, setting_path
from autoconfig.sweep.spec import load_sweep, parse_sweep
from cli_runner import cli

ROOT = Path(__file__).resolve().parent.parent
NIGHTLY = ROOT / "configs" / "sweeps" / "nightly-example.yaml"
PNG = b"\x89PNG\r\n\x1a\n"


def test_nightly_example_has_12_settings_over_3_models_2_gpus_2_node_counts():
    spec = load_sweep(NIGHTLY)
    assert len(spec.settings) >= 12
    assert len({s.model.label for s in spec.settings}) == 3
    assert len({s.gpu for s in spec.settings}) == 2
    assert len({s.nodes for s in spec.settings}) == 2
    assert {s.mode for s in spec.settings} == {"predict"}


def test_nightly_example_end_to_end(tmp_path):
    # Its time target (under a minute) is checked by benchmarks/search_speed.py, not here.
    out = tmp_path / "run"
    proc = cli("sweep", NIGHTLY, "-o", out)
    assert proc.returncode == 0, proc.stderr
    for name in ("manifest.json", "sweep.csv", "sweep.md", "sweep.json", "sweep_scaling.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "sweep_scaling.png").read_bytes()[:8] == PNG
    assert "](sweep_scaling.png)" in (out / "sweep.md").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["autoconfig_version"] and manifest["host"] and manifest["created_at"]
    hashed = manifest["files_sha256"]
    assert "configs/gpus/h100-80gb.yaml" in hashed and "configs/models/gpt3-175b.yaml" in hashed
    assert "heuristics/perf.yaml" in hashed and "heuristics/stacks/megatron-lm.yaml" in hashed
    assert all(len(h) == 64 for h in hashed.values())
    df = pd.read_csv(out / "sweep.csv")
    assert len(df) == 12 and set(df["status"]) == {"ok"}
    assert df["key"].is_unique and len(list((out / SETTINGS_DIR).glob("*.json"))) == 12
    for col in ("best_plan", "predicted_tokens_per_s_per_gpu", "predicted_step_time_s",
                "predicted_mfu", "predicted_memory_gib", "runner_up_plan",
                "measured_tokens_per_s_per_gpu"):
        assert col in df.columns
    assert (df["predicted_tokens_per_s_per_gpu"] > 0).all()
    doc = json.loads((out / "sweep.json").read_text())
    assert [r["key"] for r in doc["settings"]] == list(df["key"])


def _write(tmp_path, data) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


SMALL = {"name": "t", "matrix": {"model": [{"model": "gpt3", "size": "1.3b"}],
                                 "gpu": ["h100"], "nodes": [1, 2]},
         "settings": [{"model": {"model": "gpt3", "size": "175b"}, "gpu": "a100-80gb",
                       "nodes": 1},
                      {"model": {"model": "gpt3", "size": "1.3b"}, "gpu": "a100-80gb",
                       "nodes": 1, "precision": "fp8"}]}


def test_failing_settings_are_recorded_and_the_sweep_goes_on(tmp_path):
    spec = parse_sweep(SMALL)
    records = run_sweep(spec, tmp_path / "run")
    assert [r["status"] for r in records] == ["ok", "ok", "infeasible", "infeasible"]
    assert "would fit" in records[2]["reason"] and "fp8" in records[3]["reason"]


def test_resume_skips_settings_with_a_final_record(tmp_path):
    spec = parse_sweep(SMALL)
    out = tmp_path / "run"
    run_sweep(spec, out)
    first = setting_path(out, spec.settings[0])
    before = first.read_text()
    setting_path(out, spec.settings[1]).unlink()          # as if killed before it finished
    marker = json.loads(before)
    marker["reason"] = "kept"                             # a re-run would overwrite this
    first.write_text(json.dumps(marker))
    records = run_sweep(spec, out)
    assert records[0]["reason"] == "kept"
    assert setting_path(out, spec.settings[1]).is_file()
    assert len(json.loads((out / "manifest.json").read_text())["resumed"]) == 1


def test_retry_runs_failed_settings_again(tmp_path):
    spec = parse_sweep(SMALL)
    out = tmp_path / "run"
    run_sweep(spec, out)
    path = setting_path(out, spec.settings[0])
    failed = json.loads(path.read_text())
    failed.update(status="error", reason="node went away")
    path.write_text(json.dumps(failed))
    assert run_sweep(spec, out)[0]["status"] == "error"            # final without --retry
    records = run_sweep(spec, out, retry=("failed",))
    assert records[0]["status"] == "ok"
    assert [r["status"] for r in records[2:]] == ["infeasible", "infeasible"]   # not named


def test_every_setting_failed_exits_1_and_still_writes_reports(tmp_path):
    path = _write(tmp_path, {"settings": [SMALL["settings"][0]]})
    proc = cli("sweep", path, "-o", tmp_path / "run", "--no-plots")
    assert proc.returncode == 1
    assert "every setting failed" in proc.stderr
    df = pd.read_csv(tmp_path / "run" / "sweep.csv")
    assert list(df["status"]) == ["infeasible"]


def test_resume_flag_needs_a_run_directory(tmp_path):
    path = _write(tmp_path, SMALL)
    proc = cli("sweep", path, "--resume", tmp_path / "nothing")
    assert proc.returncode == 2 and "no manifest.json" in proc.stderr


@pytest.mark.parametrize("data, message", [
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"], "nodes": [1]}, "colour": 1},
     "unknown top-level key 'colour': allowed are name"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"]}}, "missing 'nodes'"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"], "nodes": [0]}},
     "invalid nodes 0: must be a positive integer"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["v100"], "nodes": [1]}},
     "gpu: unknown GPU 'v100': allowed are"),
    ({"matrix": {"model": ["nope"], "gpu": ["h100"], "nodes": [1]}}, "unknown model 'nope'"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"], "nodes": [1],
                 "precision": ["fp16"]}}, "invalid precision 'fp16': allowed are bf16, fp8"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"], "nodes": [1],
                 "mode": ["measure"]}}, "invalid mode 'measure': allowed are predict, profile"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"], "nodes": [1], "stack": ["x"]}},
     "invalid stack 'x': allowed are"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"], "nodes": [1],
                 "stack": ["llm-foundry"], "mode": ["profile"]}},
     "profiling runs megatron-core training steps, and stack llm-foundry runs pytorch-fsdp"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"], "nodes": [1], "gbs": [-4]}},
     "gbs: invalid value -4"),
    ({"matrix": {"model": [{"layers": 2, "hidden": 64}], "gpu": ["h100"], "nodes": [1]}},
     "inline model shape needs --heads, --vocab"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"], "nodes": [1]},
      "profile": {"device": "tpu"}}, "invalid device 'tpu': allowed are cuda, cpu"),
    ({"matrix": {"model": ["gpt3-1.3b"], "gpu": ["h100"], "nodes": [1]},
      "settings": [{"model": "gpt3-1.3b", "gpu": "h100", "nodes": 1}]}, "appears twice"),
    ([1, 2], "expected a mapping"),
    ({"matrix": {"model": [{"modl": "gpt3", "size": "1.3b"}], "gpu": ["h100"], "nodes": [1]}},
     "matrix: model: unknown key 'modl': allowed are model and size (a catalog model) or name,"),
])
def test_bad_sweep_files_fail_with_one_line_naming_the_value(tmp_path, data, message):
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")) as exc:
        parse_sweep(data)
    assert "\n" not in str(exc.value)
    path = _write(tmp_path, data)
    proc = cli("sweep", path, "-o", tmp_path / "run")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_inline_shape_settings_run(tmp_path):
    spec = parse_sweep({"matrix": {"model": [{"name": "mini", "layers": 4, "hidden": 256,
                                              "heads": 4, "vocab": 1024, "seq_len": 512}],
                                   "gpu": ["h100"], "nodes": [1], "gbs": [64]}})
    records = run_sweep(spec, tmp_path)
    assert records[0]["status"] == "ok" and records[0]["seq_len"] == 512
    assert spec.settings[0].key.startswith("mini|h100-80gb|1n|gbs=64")


def test_progress_bar_is_quiet_when_not_a_tty():
    import io

    from autoconfig.progress import Progress
    stream = io.StringIO()
    with Progress(3, "x", stream=stream) as bar:
        bar.advance("a")
    assert stream.getvalue() == ""

    class Tty(io.StringIO):
        def isatty(self):
            return True
    tty = Tty()
    with Progress(2, "x", stream=tty) as bar:
        bar.advance("a")
    assert "1/2" in tty.getvalue()


def test_a_token_budget_gives_days_to_train(tmp_path):
    from autoconfig.sweep.summary import sweep_table
    spec = parse_sweep({"tokens": "1t", "matrix": {"model": ["llama3-8b"], "gpu": ["h100"],
                                                    "nodes": [8]}})
    row = sweep_table(run_sweep(spec, tmp_path), spec.tokens).iloc[0]
    assert row.train_days == pytest.approx(
        1e12 / (row.predicted_tokens_per_s_per_gpu * row.gpus) / 86400)
