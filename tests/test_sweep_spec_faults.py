"""A bad value in a sweep file is refused when the file is loaded, before any
setting runs: one ``error:`` line naming the file, the key and the value, exit
status 2, never a traceback."""

import pytest

from autoconfig.sweep.spec import load_sweep
from cli_runner import run_cli

SHAPE = "{layers: 4, hidden: 256, heads: 4, vocab: 1024}"
BASE = "matrix: {model: [llama3-8b], gpu: [h100], nodes: [1]}\n"


def _inline(**fields) -> str:
    shape = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1024, **fields}
    items = ", ".join(f"{k}: {v}" for k, v in shape.items())
    return f"matrix: {{model: [{{{items}}}], gpu: [h100], nodes: [1]}}\n"


def _refused(tmp_path, capsys, text: str, *needles: str) -> str:
    path = tmp_path / "bad-sweep.yaml"
    path.write_text(text)
    code, out, err = run_cli(["sweep", str(path), "-o", str(tmp_path / "out"), "--no-plots"],
                             capsys)
    assert code == 2, (code, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("error:"), line
    assert str(path) in line, line
    for needle in needles:
        assert needle in line, (needle, line)
    assert not (tmp_path / "out" / "settings").exists()
    return line


@pytest.mark.parametrize("fields, needle", [
    ({"layers": "four"}, "invalid layers 'four': must be a positive integer"),
    ({"layers": ".nan"}, "invalid layers nan"),
    ({"layers": 4.5}, "invalid layers 4.5"),
    ({"hidden": 0}, "invalid hidden 0"),
    ({"vocab": 100000000000}, "invalid vocab"),
    ({"seq_len": ".nan"}, "invalid seq_len nan"),
    ({"swiglu": "'no'"}, "invalid swiglu 'no': must be true or false"),
    ({"swiglu": 1}, "invalid swiglu 1: must be true or false"),
])
def test_inline_shape_values(tmp_path, capsys, fields, needle):
    line = _refused(tmp_path, capsys, _inline(**fields), "matrix: model:", needle)
    assert "num_layers" not in line and "inline shape:" not in line


@pytest.mark.parametrize("profile, needle", [
    ("{max_runs: 0}", "invalid max_runs 0: must be a positive integer"),
    ("{top_k: 0}", "invalid top_k 0: must be a positive integer"),
    ("{max_steps: 0}", "invalid max_steps 0: must be a positive integer"),
    ("{max_minutes: 0}", "invalid max_minutes 0: must be a positive integer"),
    ("{max_parallel: 0}", "invalid max_parallel 0: must be a positive integer"),
    ("{time_limit: 0}", "invalid time_limit 0: must be a positive integer"),
    ("{profile_objective: fastest}", "allowed are throughput, latency"),
    ("{device: cpu, executor: replay}", "--measurements"),
])
def test_profile_values(tmp_path, capsys, profile, needle):
    _refused(tmp_path, capsys, BASE + f"profile: {profile}\n", "profile:", needle)


@pytest.mark.parametrize("kind", ["missing", "directory", "empty"])
def test_replay_measurements_checked_at_load(tmp_path, capsys, kind):
    target = tmp_path / "measured.csv"
    if kind == "directory":
        target.mkdir()
    elif kind == "empty":
        target.write_text("")
    _refused(tmp_path, capsys,
             BASE + f"profile: {{device: cpu, executor: replay, measurements: '{target}'}}\n",
             "profile:", "measured.csv")


@pytest.mark.parametrize("text, needle", [
    ("matrix: {model: [llama3-8b], gpu: [h100], nodes: [100000000000]}\n",
     "invalid nodes 100000000000"),
    ("matrix: {model: [llama3-8b], gpu: [h100], nodes: [1], gbs: [1000000000000]}\n",
     "matrix: gbs: invalid value"),
    ("matrix: {model: [llama3-8b], gpu: [h100], nodes: [1], seq_len: [100000000000]}\n",
     "matrix: seq_len: invalid value"),
    ("matrix: {model: [llama3-8b], gpu: [h100], nodes: [16]}\ngpus_per_node: 100000\n",
     "invalid nodes 16 x gpus_per_node 100000"),
    ("matrix: {model: [llama3-8b], gpu: [h100], nodes: [1000000]}\n",
     "invalid nodes 1000000 x gpus_per_node 8"),
    (BASE + "gpus_per_node: 100000000\n", "gpus_per_node: invalid value 100000000"),
])
def test_huge_counts(tmp_path, capsys, text, needle):
    _refused(tmp_path, capsys, text, needle)


def test_tokens_nan_names_the_file(tmp_path, capsys):
    _refused(tmp_path, capsys, BASE + "tokens: .nan\n", "tokens", "nan")


def test_swiglu_true_still_loads(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(_inline(swiglu="true", seq_len=2048)
                    + "profile: {top_k: 2, max_steps: 1, warmup_steps: 0, "
                      "profile_objective: latency}\n")
    spec = load_sweep(path)
    assert dict(spec.settings[0].model.shape)["swiglu"] is True
    assert spec.profile["warmup_steps"] == 0
