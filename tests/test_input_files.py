"""Input files a user names and the files a run leaves behind: a device, a FIFO,
a directory, non-UTF-8 bytes or a damaged JSON file each give one line naming
the file (or are set aside and the run goes on), never a hang or a traceback."""

import json
import os

import pytest

from autoconfig.profiling import store
from autoconfig.sweep.run import load_record, run_sweep, setting_path
from autoconfig.sweep.spec import parse_sweep
from tests.cli_runner import run_cli

SPEC = {"name": "x", "matrix": {"model": [{"model": "gpt3", "size": "1.3b"}],
                                "gpu": ["a100-80gb"], "nodes": [1]}}


def _one_line_error(code, err, name):
    assert code != 0 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and name in err


@pytest.fixture
def odd_files(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    return {"device": "/dev/zero", "fifo": str(fifo), "binary": str(binary),
            "directory": str(tmp_path)}


@pytest.mark.parametrize("kind", ["device", "fifo", "binary", "directory"])
def test_model_gpu_sweep_and_runs_files_that_are_not_text(kind, odd_files, capsys):
    path = odd_files[kind]
    for args in (["search", "--model", path, "--nodes", "1"],
                 ["search", "--model", "tiny", "--gpu", path, "--gpus", "4"],
                 ["sweep", path],
                 ["validate", "--runs", path]):
        code, _, err = run_cli(args, capsys)
        _one_line_error(code, err, path)


@pytest.mark.parametrize("content", [b"[1, 2]", b"{not json", b"\xff\xfe", b'"text"'])
def test_damaged_setting_record_runs_the_setting_again(tmp_path, content):
    spec = parse_sweep(SPEC)
    run_sweep(spec, tmp_path)
    path = setting_path(tmp_path, spec.settings[0])
    path.write_bytes(content)
    assert load_record(tmp_path, spec.settings[0]) is None
    records = run_sweep(spec, tmp_path)
    assert records[0]["status"] == "ok" and json.loads(path.read_text())["status"] == "ok"


def test_damaged_manifest_is_set_aside_not_fatal(tmp_path):
    spec = parse_sweep(SPEC)
    run_sweep(spec, tmp_path)
    (tmp_path / "manifest.json").write_bytes(b"\xff garbage")
    run_sweep(spec, tmp_path)
    assert json.loads((tmp_path / "manifest.json").read_text())["sweep_name"] == "x"
    assert (tmp_path / "manifest.json.corrupt").read_bytes() == b"\xff garbage"


def test_compare_and_report_of_damaged_sweep_json(tmp_path, capsys):
    (tmp_path / "sweep.json").write_text("[1, 2, 3]")
    code, _, err = run_cli(["compare", str(tmp_path), str(tmp_path)], capsys)
    _one_line_error(code, err, "sweep.json")


def test_damaged_meta_json_does_not_break_the_report(tmp_path, capsys):
    store.write_plans(tmp_path, __import__("pandas").DataFrame(columns=["tp"]), {})
    (tmp_path / store.META_FILE).write_text("[not, an, object")
    (tmp_path / store.RESULTS_FILE).write_text("")
    code, out, err = run_cli(["report", str(tmp_path)], capsys)
    assert code == 0 and "Traceback" not in err


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_compare_refuses_a_threshold_that_passes_everything(value, tmp_path, capsys):
    spec = parse_sweep(SPEC)
    run_sweep(spec, tmp_path / "run")
    code, _, err = run_cli(["compare", "--threshold", value, str(tmp_path / "run"),
                            str(tmp_path / "run")], capsys)
    _one_line_error(code, err, "--threshold")


def test_a_full_disk_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    import errno
    from autoconfig import atomic

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(atomic.tempfile, "mkstemp", full)
    code, _, err = run_cli(["search", "--model", "gpt3", "--size", "1.3b", "--nodes", "1",
                            "--no-plots", "-o", str(tmp_path / "out")], capsys)
    _one_line_error(code, err, str(tmp_path / "out"))
    assert "No space left" in err and "-o" in err


@pytest.mark.parametrize("args", [["sweep", "x" * 300], ["report", "x" * 300],
                                  ["search", "--model", "tiny", "--gpus", "4", "--no-plots", "-o",
                                   "/tmp/" + "y" * 100000]])
def test_names_the_file_system_refuses_and_huge_values_are_shortened(args, capsys):
    code, _, err = run_cli(args, capsys)
    assert code != 0 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and len(err) <= 300
