"""Damaged files under a profiling results folder and a sweep run directory, as a
user meets them on the command line: one line naming the file, never a
traceback; and --no-plots honoured under --profile."""

import contextlib
import errno
import io
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from autoconfig.cli import main
from autoconfig.core.plan import PLAN_FIELDS
from autoconfig.profiling import store
from tests.cli_runner import run_cli

SEARCH = ["search", "--gpu", "h100", "--model", "tiny", "--gpus", "8", "--no-plots"]
SWEEP = {"name": "faults", "matrix": {"model": [{"model": "gpt3", "size": "1.3b"}],
                                      "gpu": ["h100", "a100-80gb"], "nodes": [1]}}


def _main(args) -> tuple[int, str, str]:
    """``autoconfig ARGS`` in-process for module fixtures (no capsys there)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code
    return code, out.getvalue(), err.getvalue()


def _one_line_error(code, out, err, name):
    assert code != 0, out + err
    assert "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ") and str(name) in err, err


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    """A replayed --profile search with --no-plots: (root, measurements CSV)."""
    root = tmp_path_factory.mktemp("faults")
    code, _, err = _main([*SEARCH, "-o", root / "grid"])
    assert code == 0, err
    grid = pd.read_csv(root / "grid" / store.PLANS_FILE)
    table = grid[[c for c in PLAN_FIELDS if c in grid.columns]].copy()
    table["recompute_modules"] = table["recompute_modules"].astype(str).replace("nan", "")
    table["step_time_s"] = grid["step_time_s"] * 1.2
    table.head(20).to_csv(root / "measured.csv", index=False)
    code, _, err = _main(_profile_args(root, root / "run"))
    assert code == 0, err
    return root


def _profile_args(root: Path, out: Path, *extra) -> list:
    return [*SEARCH, "--profile", "--executor", "replay", "--measurements",
            root / "measured.csv", "--top-k", "3", "-o", out, *extra]


def _store_copy(profiled, tmp_path) -> Path:
    folder = tmp_path / "store"
    shutil.copytree(profiled / "run" / store.PROFILE_SUBDIR, folder)
    return folder


CORRUPT_CSV = {"empty": b"", "binary": bytes(range(128, 256)) * 4,
               "unterminated quote": b'tp,pp,dp\n"1,1,8\n2,1,4\n'}


# ---------------------------------------------------------------- 1: plans.csv


@pytest.mark.parametrize("damage", CORRUPT_CSV)
def test_report_of_a_corrupt_plans_csv_is_one_line_naming_it(profiled, tmp_path, capsys,
                                                             damage):
    folder = _store_copy(profiled, tmp_path)
    (folder / store.PLANS_FILE).write_bytes(CORRUPT_CSV[damage])
    code, out, err = run_cli(["report", str(folder)], capsys)
    _one_line_error(code, out, err, folder / store.PLANS_FILE)
    assert "corrupt" in err


@pytest.mark.parametrize("damage", CORRUPT_CSV)
def test_resume_with_a_corrupt_plans_csv_is_one_line_naming_it(profiled, tmp_path, capsys,
                                                               damage):
    folder = _store_copy(profiled, tmp_path)
    (folder / store.PLANS_FILE).write_bytes(CORRUPT_CSV[damage])
    args = _profile_args(profiled, tmp_path / "out", "--resume", folder)
    code, out, err = run_cli([str(a) for a in args], capsys)
    _one_line_error(code, out, err, folder / store.PLANS_FILE)
    assert "corrupt" in err
    assert not (folder / store.LOCK_FILE).exists()   # the lock is let go


# ---------------------------------------------------------------- 2: meta.json


META_DAMAGE = {"missing": None, "not valid JSON": b"{not json",
               "not UTF-8": b"\xff\xfe\x00" * 9, "not a JSON object": b"[1, 2]"}
"""What is wrong with meta.json -> its bytes (None: no file)."""


@pytest.mark.parametrize("damage", META_DAMAGE)
def test_calibrate_names_a_missing_or_damaged_meta_json(profiled, tmp_path, capsys, damage):
    folder = _store_copy(profiled, tmp_path)
    meta = folder / store.META_FILE
    if META_DAMAGE[damage] is None:
        meta.unlink()
    else:
        meta.write_bytes(META_DAMAGE[damage])
    code, out, err = run_cli(["calibrate", str(folder), "-o", str(tmp_path / "c.yaml")],
                             capsys)
    _one_line_error(code, out, err, meta)
    assert "KeyError" not in err
    assert damage in err
    assert not (tmp_path / "c.yaml").exists()


@pytest.mark.parametrize("damage", ["not valid JSON", "not UTF-8", "not a JSON object"])
def test_report_warns_in_one_line_naming_a_damaged_meta_json(profiled, tmp_path, capsys,
                                                             damage):
    # The report goes on without it (as with unusable results lines): exit 0, one warning.
    folder = _store_copy(profiled, tmp_path)
    meta = folder / store.META_FILE
    meta.write_bytes(META_DAMAGE[damage])
    code, out, err = run_cli(["report", str(folder)], capsys)
    assert code == 0, err
    assert "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("warning: ") and str(meta) in err and damage in err


# ---------------------------------------------------------------- 3: no results


@pytest.mark.parametrize("results", ["", "torn {\"status\": \"ok\"\n\x00garbage\n"])
def test_report_without_results_says_none_were_found_in_the_file(profiled, tmp_path, capsys,
                                                                 results):
    folder = _store_copy(profiled, tmp_path)
    (folder / store.RESULTS_FILE).write_text(results)
    code, out, err = run_cli(["report", str(folder)], capsys)
    assert code == 0, err
    assert "Traceback" not in out + err
    assert "Every one of the 0" not in out
    assert f"no job results were found in {folder / store.RESULTS_FILE}" in out
    assert len(err.strip().splitlines()) == (1 if results else 0), err   # the unusable lines


# ---------------------------------------------------------------- 4: compare


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults-sweep")
    (root / "sweep.yaml").write_text(yaml.safe_dump(SWEEP))
    code, _, err = _main(["sweep", root / "sweep.yaml", "-o", root / "old", "--no-plots"])
    assert code == 0, err
    return root / "old"


def _set(path: Path, dotted: str, value) -> None:
    record = json.loads(path.read_text())
    *parents, last = dotted.split(".")
    inner = record
    for name in parents:
        inner = inner.setdefault(name, {})
    inner[last] = value
    path.write_text(json.dumps(record))


RECORD_DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:100]),
    "binary": lambda p: p.write_bytes(b"\x00\xff not json" * 20),
    "a list": lambda p: p.write_text("[]"),
    "an empty object": lambda p: p.write_text("{}"),
    "best.predicted.tokens_per_s_per_gpu": lambda p: _set(
        p, "best.predicted.tokens_per_s_per_gpu", "abc"),
    "measured.tokens_per_s_per_gpu": lambda p: _set(p, "measured.tokens_per_s_per_gpu", "abc"),
    "best": lambda p: _set(p, "best", "tp1 pp1"),
    # non-finite or missing figures of an ok setting: NaN compared as unchanged,
    # Infinity as an endless improvement
    "predicted NaN": lambda p: _set(p, "best.predicted.tokens_per_s_per_gpu", float("nan")),
    "predicted Infinity": lambda p: _set(p, "best.predicted.tokens_per_s_per_gpu",
                                         float("inf")),
    "predicted null": lambda p: _set(p, "best.predicted.tokens_per_s_per_gpu", None),
}


@pytest.mark.parametrize("side", ["new", "old"])
@pytest.mark.parametrize("damage", RECORD_DAMAGE)
def test_compare_with_a_corrupt_setting_record_is_one_line_naming_it(
        sweep_run, tmp_path, capsys, monkeypatch, damage, side):
    # relative paths: the message's words stay short enough to be shown whole
    monkeypatch.chdir(tmp_path)
    shutil.copytree(sweep_run, "damaged")
    shutil.copytree(sweep_run, "intact")
    path = sorted(Path("damaged", "settings").glob("*.json"))[0]
    if damage == "measured.tokens_per_s_per_gpu":   # both runs measured: compared
        for other in (Path("intact", "settings") / path.name,):
            _set(other, "measured.tokens_per_s_per_gpu", 1000.0)
    RECORD_DAMAGE[damage](path)
    args = ["damaged", "intact"] if side == "old" else ["intact", "damaged"]
    code, out, err = run_cli(["compare", *args], capsys)
    _one_line_error(code, out, err, path)
    assert "no regression" not in out and "only in" not in out
    if "." in damage or damage == "best":   # a field of the wrong type is named
        assert f"'{damage}'" in err



@pytest.mark.parametrize("code, advice", [
    (errno.EROFS, "give a --markdown file in a writable folder"),
    (errno.EACCES, "check its permissions or give another --markdown file"),
    (errno.ENOSPC, "free space there or give another --markdown file"),
])
def test_compare_markdown_it_cannot_write_is_advised_by_its_own_option(
        sweep_run, tmp_path, capsys, monkeypatch, code, advice):
    # compare has no -o: the advice names the option that gave the file
    monkeypatch.chdir(tmp_path)     # a short path: shown whole
    summary = "summary.md"

    def refuse(path, text, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(path))
    monkeypatch.setattr("autoconfig.atomic.write_atomic", refuse)
    exit_code, _, err = run_cli(["compare", str(sweep_run), str(sweep_run),
                                 "--markdown", str(summary)], capsys)
    assert exit_code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{os.strerror(code)}: {summary} ({advice})" in err
    assert "-o)" not in err and "Traceback" not in err


# ---------------------------------------------------------------- 5: --no-plots


def test_no_plots_under_profile_writes_no_png(profiled):
    profile = profiled / "run" / store.PROFILE_SUBDIR
    assert (profile / "profile_report.md").is_file()
    assert not list(profiled.glob("run/**/*.png"))
    assert "![" not in (profile / "profile_report.md").read_text()


@pytest.mark.parametrize("flags, message", [
    (["--executor", "replay", "--measurements", "/nonexistent/m.csv"],
     "cannot read measurements file '/nonexistent/m.csv'"),
    (["--executor", "replay"], "--executor replay needs --measurements FILE.csv"),
    (["--executor", "local", "--device", "cpu", "--resume", "/nonexistent"],
     "invalid --resume /nonexistent: no plans.csv there"),
])
def test_profiling_inputs_are_checked_before_the_search(tmp_path, capsys, flags, message):
    """Not after the search has written its launch files and report."""
    out = tmp_path / "out"
    code, stdout, err = run_cli(["search", "--gpu", "h100", "--no-plots", "--model", "tiny",
                                 "--gpus", "8", "--profile", *flags, "-o", str(out)], capsys)
    assert code == 2 and "Traceback" not in stdout + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0]
    assert not out.exists()
