"""Bad rows of a user's ``infer-validate --points`` file: each is set aside with a
one-line reason naming the point, the column and the value, and the rest are
scored; never a traceback, never a silently wrong figure. Files are cut from the
shipped points (the whole file takes minutes)."""

import pandas as pd
import pytest

from autoconfig.inference.published import ValidationResult, default_points_path
from autoconfig.validation.serving_targets import serving_targets
from cli_runner import run_cli

STATIC = ("I001", "I003")           # FasterTransformer static batches (SI01)
JOB = ("J154", "J096")              # closed-loop jobs: clients and num_requests
RATED = ("J158", "J096")            # J158: 300 requests at 1 request/s


def _points(tmp_path, ids, point=None, column=None, value=None) -> str:
    """The shipped points ``ids`` with ``column`` of ``point`` set to ``value``
    (written as text: '' is a blank cell)."""
    points = pd.read_csv(default_points_path())
    rows = points[points["point_id"].isin(ids)].copy()
    if column is not None:
        rows[column] = rows[column].astype(object)
        rows.loc[rows["point_id"] == point, column] = value
    path = tmp_path / "points.csv"
    rows.to_csv(path, index=False)
    return str(path)


def _validate(path, capsys) -> str:
    code, out, err = run_cli(["infer-validate", "--points", path], capsys)
    assert code == 0, err
    assert "Traceback" not in out + err
    return out


def _one_set_aside(out: str, point: str, source: str, reason: str) -> None:
    assert "1 points asked, 1 could not be" in out
    assert f"  {point} ({source}): {reason}" in out


@pytest.mark.parametrize("engine", [None, "foo"])
def test_a_file_where_no_point_is_asked_says_so(capsys, tmp_path, engine) -> None:
    """Header only, or every row of an unknown engine: no KeyError from the figures."""
    path = _points(tmp_path, STATIC if engine else ())
    if engine:
        rows = pd.read_csv(path).assign(engine=engine)
        rows.to_csv(path, index=False)
    out = _validate(path, capsys)
    assert "(no points asked)" in out
    assert f"0 points asked, {2 if engine else 0} could not be" in out


def test_targets_of_an_empty_table_are_none() -> None:
    empty = ValidationResult(table=pd.DataFrame(), seed_order_holds=None,
                             skipped=pd.DataFrame(columns=["point_id", "source_id", "reason"]))
    assert serving_targets(empty) == []


@pytest.mark.parametrize("ids, point, source, column, value, reason", [
    (STATIC, "I001", "SI01", "latency_ms", "0", "invalid latency_ms 0: must be a positive"),
    (STATIC, "I001", "SI01", "throughput_samples_per_s", "0",
     "invalid throughput_samples_per_s 0: must be a positive"),
    (JOB, "J154", "SI09", "throughput_tokens_per_s", "0",
     "invalid throughput_tokens_per_s 0: must be a positive"),
    (JOB, "J154", "SI09", "ttft_ms", "-5", "invalid ttft_ms -5: must be a positive"),
    (JOB, "J154", "SI09", "tpot_ms", "inf", "invalid tpot_ms inf: must be a positive finite"),
    (STATIC, "I001", "SI01", "latency_ms", "abc", "invalid latency_ms 'abc': not a number"),
])
def test_a_measured_figure_that_is_not_positive_is_a_reason(
        capsys, tmp_path, ids, point, source, column, value, reason) -> None:
    """Not a ZeroDivisionError, a negative error, nor a text cell read as not measured."""
    out = _validate(_points(tmp_path, ids, point, column, value), capsys)
    _one_set_aside(out, point, source, reason)


@pytest.mark.parametrize("ids, point, source, column, value", [
    (STATIC, "I001", "SI01", "batch", "inf"),
    (STATIC, "I001", "SI01", "tp", "inf"),
    (STATIC, "I001", "SI01", "pp", "inf"),
    (STATIC, "I001", "SI01", "num_gpus", "inf"),
    (JOB, "J154", "SI09", "clients", "inf"),
    (JOB, "J154", "SI09", "num_requests", "inf"),
    (STATIC, "I001", "SI01", "num_gpus", "-32"),
    (STATIC, "I001", "SI01", "num_gpus", "0"),
    (STATIC, "I001", "SI01", "tp", "0"),
    (STATIC, "I001", "SI01", "pp", "0"),
    (STATIC, "I001", "SI01", "tp", "8.5"),
    (STATIC, "I001", "SI01", "batch", "64.5"),
    (RATED, "J158", "SI10", "num_requests", "300.5"),
])
def test_a_count_that_is_not_a_positive_whole_number_is_a_reason(
        capsys, tmp_path, ids, point, source, column, value) -> None:
    """Not an aborted run, a truncation, nor 0 read as blank."""
    out = _validate(_points(tmp_path, ids, point, column, value), capsys)
    _one_set_aside(out, point, source,
                   f"invalid {column} {value}: must be a positive whole number")


@pytest.mark.parametrize("column, value", [("input_len_tokens", "inf"),
                                           ("output_len_tokens", "inf")])
def test_an_infinite_length_is_a_reason(capsys, tmp_path, column, value) -> None:
    out = _validate(_points(tmp_path, STATIC, "I001", column, value), capsys)
    _one_set_aside(out, "I001", "SI01", f"invalid {column} inf: must be a finite")


def test_gpus_that_are_not_whole_replicas_are_a_reason(capsys, tmp_path) -> None:
    """I001 runs TP 8 x PP 4: 31 GPUs are no whole number of 32-GPU replicas."""
    out = _validate(_points(tmp_path, STATIC, "I001", "num_gpus", "31"), capsys)
    _one_set_aside(out, "I001", "SI01", "invalid num_gpus 31: must be a whole number of "
                   "replicas of tp x pp = 32 GPUs")


def test_a_static_point_without_a_batch_is_a_reason(capsys, tmp_path) -> None:
    out = _validate(_points(tmp_path, STATIC, "I001", "batch", ""), capsys)
    _one_set_aside(out, "I001", "SI01", "no batch given")


@pytest.mark.parametrize("ids, point, source, column, value", [
    (RATED, "J158", "SI10", "request_rate_per_s", "nan"),
    (JOB, "J154", "SI09", "clients", "nan"),
    (STATIC, "I001", "SI01", "batch", "NaN"),
])
def test_a_nan_cell_is_a_reason_not_a_blank(capsys, tmp_path, ids, point, source, column,
                                            value) -> None:
    """A literal nan would turn a rate-driven or closed-loop point into an offline one."""
    out = _validate(_points(tmp_path, ids, point, column, value), capsys)
    _one_set_aside(out, point, source, f"invalid {column} '{value}': not a number")


def test_a_zero_request_rate_is_a_reason(capsys, tmp_path) -> None:
    out = _validate(_points(tmp_path, RATED, "J158", "request_rate_per_s", "0"), capsys)
    _one_set_aside(out, "J158", "SI10", "invalid request_rate_per_s 0: must be a positive")


def test_only_seed_points_default_to_the_legacy_engine(capsys, tmp_path) -> None:
    out = _validate(_points(tmp_path, ("I001", "J096"), "J096", "engine", ""), capsys)
    _one_set_aside(out, "J096", "SI08", "no engine given")
    out = _validate(_points(tmp_path, ("I001", "J096"), "I001", "engine", ""), capsys)
    assert "2 points asked, 0 could not be" in out and "I001     fastertransformer" in out


def test_a_file_without_the_engine_column_is_one_line(capsys, tmp_path) -> None:
    path = _points(tmp_path, STATIC)
    pd.read_csv(path).drop(columns=["engine"]).to_csv(path, index=False)
    code, out, err = run_cli(["infer-validate", "--points", path], capsys)
    assert code == 2 and not out
    assert err.strip() == f"error: {path}: missing column(s) engine"
