"""Bad input gets one line naming the value and what is allowed, never a
traceback nor a NaN result: a damaged or hand-edited calibration file, a
non-finite or out-of-range float option, a 0 taken for "not given", a GPU or
model YAML file with NaN, infinite, fractional-count or non-boolean values."""

import math
from pathlib import Path

import pytest
import yaml

from autoconfig.paths import configs_dir
from autoconfig.profiling import calibrate
from autoconfig.training.step_time import load_constants
from autoconfig.validation.calibration import get_value
from autoconfig.validation.crossval_store import model_fingerprint
from tests.cli_runner import run_cli

ESTIMATE = ["estimate", "--model", "tiny", "--gpu", "h100", "--gpus", "8", "--gbs", "16"]
CAPACITY = ["capacity", "--model", "tiny", "--gpu", "h100", "--nodes", "1", "--no-plots"]
INFER = ["infer", "--model", "tiny", "--gpu", "h100", "--gpus", "1", "--input-len", "128",
         "--output-len", "64", "--no-plots"]


def _one_line_error(code, err, *names):
    assert code != 0 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1, err
    for name in names:
        assert name in err, (name, err)


# ---------------------------------------------------------------- calibration files


@pytest.fixture
def calibration(tmp_path) -> Path:
    """A valid calibration file for h100-80gb, written as `autoconfig calibrate` does."""
    base = load_constants()
    keys = [("gemm_efficiency_max", "hopper"), ("comm_bandwidth_efficiency",)]
    cal = calibrate.Calibration(
        values={k: 0.9 * get_value(base, k) for k in keys},
        defaults={k: get_value(base, k) for k in keys}, gpu="h100-80gb", device="cuda",
        records=(), before_pct=10.0, after_pct=5.0, fingerprint=model_fingerprint())
    return calibrate.write_calibration(tmp_path / "cal.yaml", cal)


def _corrupt(path: Path, change) -> Path:
    data = yaml.safe_load(path.read_text())
    change(data)
    out = path.with_name("corrupt.yaml")
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _set(field, value, index=0):
    def change(data):
        data["constants"][index][field] = value
    return change


def test_a_valid_calibration_file_still_applies(calibration, capsys):
    code, out, err = run_cli([*ESTIMATE, "--calibration", str(calibration)], capsys)
    assert code == 0, err
    assert "calibrated by" in out and "nan" not in out


@pytest.mark.parametrize("change, names", [
    (_set("key", ["no_such_const"]), ["no_such_const", "allowed are",
                                      "gemm_efficiency_max.hopper"]),
    (_set("key", []), ["key []", "allowed are"]),
    (_set("key", "gemm_efficiency_max"), ["'gemm_efficiency_max'", "allowed are"]),
    (_set("key", ["gemm_efficiency_max", "volta"]), ["gemm_efficiency_max.volta",
                                                    "allowed are"]),
], ids=["unknown-key", "empty-key", "string-key", "unknown-generation"])
def test_calibration_unknown_keys_are_one_line(calibration, capsys, change, names):
    path = _corrupt(calibration, change)
    code, _, err = run_cli([*ESTIMATE, "--calibration", str(path)], capsys)
    _one_line_error(code, err, str(path), *names)


@pytest.mark.parametrize("value, shown", [(-5, "-5"), (1e300, "1e+300"), (math.nan, "nan"),
                                          (math.inf, "inf")])
def test_calibration_values_out_of_range_are_one_line(calibration, capsys, value, shown):
    path = _corrupt(calibration, _set("value", value))
    code, out, err = run_cli([*ESTIMATE, "--calibration", str(path)], capsys)
    _one_line_error(code, err, str(path), "gemm_efficiency_max.hopper", f"value {shown}",
                    "finite number from 0.05 to 1")


@pytest.mark.parametrize("change, names", [
    (lambda d: d.pop("gpu"), ["missing field 'gpu'"]),
    (lambda d: d["constants"][0].pop("value"), ["gemm_efficiency_max.hopper has no 'value'"]),
    (lambda d: d.__setitem__("constants", 5), ["'constants' must be a list", "got 5"]),
    (lambda d: d["constants"].__setitem__(0, 5), ["constant 1 must be a mapping", "got 5"]),
    (_set("value", "abc"), ["value 'abc' is not a number"]),
    (_set("shipped", math.nan), ["shipped nan", "finite"]),
    (lambda d: d.__setitem__("residuals_pct", [1]), ["'residuals_pct' must map"]),
    (lambda d: d.__setitem__("records", 5), ["'records' must be a list"]),
    (lambda d: d.__setitem__("device", "tpu"), ["'device' 'tpu' must be cuda or cpu"]),
    (lambda d: d["constants"].append(dict(d["constants"][0])), ["given twice"]),
], ids=["no-gpu", "no-value", "int-constants", "int-entry", "text-value", "nan-shipped",
        "list-residuals", "int-records", "bad-device", "duplicate"])
def test_calibration_fields_missing_or_of_the_wrong_type_are_one_line(calibration, capsys,
                                                                       change, names):
    path = _corrupt(calibration, change)
    code, _, err = run_cli([*ESTIMATE, "--calibration", str(path)], capsys)
    _one_line_error(code, err, f"invalid calibration file {path}", *names)
    assert "object" not in err and "could not convert" not in err


# ---------------------------------------------------------------- float options


@pytest.mark.parametrize("args, names", [
    ([*ESTIMATE, "--internode-gb-per-s", "nan"], ["--internode-gb-per-s nan", "finite"]),
    ([*ESTIMATE, "--internode-gb-per-s", "inf", "--format", "json"],
     ["--internode-gb-per-s inf", "finite"]),
    ([*CAPACITY, "--price", "h100=nan"], ["'h100=nan'", "finite number >= 0"]),
    ([*CAPACITY, "--price", "h100=inf"], ["'h100=inf'", "finite number >= 0"]),
    ([*CAPACITY, "--pue", "inf"], ["--pue inf", "at least 1 and finite"]),
    ([*CAPACITY, "--pue", "nan"], ["--pue nan", "at least 1 and finite"]),
    ([*CAPACITY, "--grid-kg-per-kwh", "nan"], ["--grid-kg-per-kwh nan", "finite"]),
    ([*CAPACITY, "--grid-kg-per-kwh", "inf"], ["--grid-kg-per-kwh inf", "finite"]),
    ([*CAPACITY, "--node-overhead-w", "nan"], ["--node-overhead-w nan", "finite"]),
    ([*INFER, "--max-ttft-ms", "inf"], ["--max-ttft-ms inf", "finite"]),
    ([*INFER, "--request-rate", "inf"], ["--request-rate inf", "finite"]),
    (["base", "--size", "1.3b", "--mfu", "nan"], ["--mfu nan", "in (0, 1]"]),
    (["base", "--size", "1.3b", "--mfu", "0"], ["--mfu 0", "in (0, 1]"]),
    (["base", "--size", "1.3b", "--mfu", "2"], ["--mfu 2", "in (0, 1]"]),
    (["base", "--size", "1.3b", "--mfu", "-0.4"], ["--mfu -0.4", "in (0, 1]"]),
    (["base", "--size", "1.3b", "--tflops-per-gpu", "inf"], ["--tflops-per-gpu inf"]),
])
def test_non_finite_or_out_of_range_float_options_are_one_line(args, names, capsys, tmp_path):
    code, out, err = run_cli([*args, "-o", str(tmp_path)] if args[0] in ("capacity", "infer")
                             else args, capsys)
    _one_line_error(code, err, *names)
    assert "nan" not in out.lower()


def test_a_finite_value_of_each_checked_option_is_still_taken(capsys, tmp_path):
    code, _, err = run_cli([*CAPACITY, "--price", "h100=2.5", "--pue", "1.1",
                            "--grid-kg-per-kwh", "0.4", "--node-overhead-w", "0",
                            "-o", str(tmp_path)], capsys)
    assert code == 0, err
    code, _, err = run_cli([*ESTIMATE, "--internode-gb-per-s", "25"], capsys)
    assert code == 0, err


# ---------------------------------------------------------------- 0 is not "the default"


@pytest.mark.parametrize("command, flag", [("estimate", "--seq-len"), ("search", "--seq-len"),
                                           ("capacity", "--seq-len"), ("capacity", "--gbs"),
                                           ("estimate", "--gbs"), ("search", "--gbs")])
def test_zero_is_refused_like_a_negative_value(command, flag, capsys, tmp_path):
    args = {"estimate": ESTIMATE, "capacity": [*CAPACITY, "-o", str(tmp_path)],
            "search": ["search", "--model", "tiny", "--gpus", "8", "--no-plots",
                       "-o", str(tmp_path)]}[command]
    errors = []
    for value in ("0", "-5"):
        code, _, err = run_cli([*args, flag, value], capsys)
        _one_line_error(code, err, f"{flag} '{value}'", "expected an integer from 1")
        errors.append(err.replace(f"'{value}'", "VALUE"))
    assert errors[0] == errors[1]


# ---------------------------------------------------------------- GPU and model files


def _gpu_file(tmp_path, field, value) -> Path:
    text = (configs_dir() / "gpus" / "h100-80gb.yaml").read_text()
    lines = [f"{field}: {{value: {value}, source: \"test\"}}" if line.startswith(f"{field}:")
             else line for line in text.splitlines()]
    path = tmp_path / "gpu.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("field, value, names", [
    ("hbm_capacity_gb", ".nan", ["'hbm_capacity_gb'", "nan", "finite"]),
    ("peak_bf16_tflops", ".inf", ["'peak_bf16_tflops'", "inf", "finite"]),
    ("gpus_per_node", "3.5", ["'gpus_per_node'", "3.5", "positive whole number"]),
    ("sm_count", "0", ["'sm_count'", "positive whole number"]),
    ("peak_fp8_tflops", "-1", ["'peak_fp8_tflops'", "-1", "positive"]),
])
def test_gpu_file_numbers_must_be_finite_positive_and_whole_counts(tmp_path, capsys, field,
                                                                   value, names):
    path = _gpu_file(tmp_path, field, value)
    code, out, err = run_cli(["estimate", "--model", "tiny", "--gpu", str(path), "--gpus", "8",
                              "--gbs", "16"], capsys)
    _one_line_error(code, err, str(path), *names)
    assert "RuntimeWarning" not in err


def test_model_file_booleans_must_be_true_or_false(tmp_path, capsys):
    text = (configs_dir() / "models" / "llama3-8b.yaml").read_text()
    path = tmp_path / "model.yaml"
    path.write_text("\n".join("tied_embeddings: maybe" if line.startswith("tied_embeddings:")
                              else line for line in text.splitlines()) + "\n")
    code, _, err = run_cli(["estimate", "--model", str(path), "--gpu", "h100", "--gpus", "8",
                            "--gbs", "16"], capsys)
    _one_line_error(code, err, str(path), "'tied_embeddings'", "'maybe'", "true or false")


# ---------------------------------------------------------------- an empty output folder


@pytest.mark.parametrize("argv", [
    INFER, CAPACITY,
    ["search", "--model", "tiny", "--gpus", "8", "--no-plots"],
    ["sweep", str(Path(__file__).resolve().parents[1] / "configs" / "sweeps" / "ci-small.yaml")],
])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_output_folder_is_refused_not_read_as_the_default(argv, value, capsys,
                                                                    tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli([*argv, "-o", value], capsys)
    _one_line_error(code, err, f"invalid -o {value!r}", "give a folder")
    assert not (tmp_path / "autoconfig-out").exists()
