"""The profiling results store: records keyed by Plan, resume, pandas, reports."""

import json
import os

import pandas as pd
import pytest

from autoconfig.core.plan import Plan
from autoconfig.profiling import store
from autoconfig.profiling.report import write_report
from autoconfig.profiling.spec import ProfileResult

PLANS = [Plan(tp=1, pp=1, dp=4), Plan(tp=2, pp=1, dp=2, sp=True),
         Plan(tp=1, pp=2, dp=2, recompute="full", recompute_method="block", recompute_num_layers=1),
         Plan(tp=2, pp=2, dp=1, recompute="selective", distributed_optimizer=True)]


def _result(plan, status="ok", step=1.0, error=""):
    ok = status == "ok"
    return ProfileResult(plan=plan, status=status, device="cpu", world_size=plan.num_gpus,
                         step_time_s=step if ok else None, iteration_times_s=(step, step) if ok else (),
                         tokens_per_s_per_gpu=1000.0 / step if ok else None,
                         model_tflops_per_gpu=0.01 if ok else None,
                         peak_memory_bytes=123456 if ok else None,
                         losses=(6.9, 6.8) if ok else (), error=error, model_name="tiny-proxy")


def _plans_df(plans):
    rows = []
    for i, p in enumerate(plans):
        row = p.to_dict()
        row.update(predicted_rank=i + 1, predicted_step_time_s=0.5 * (i + 1),
                   predicted_tokens_per_s_per_gpu=2000.0 / (i + 1), predicted_memory_gib=1.0,
                   selected=True)
        rows.append(row)
    return pd.DataFrame(rows)


def test_records_are_keyed_by_plan_and_read_by_pandas(tmp_path):
    store.write_plans(tmp_path, _plans_df(PLANS), {"device": "cpu"})
    for plan, step in zip(PLANS[:2], (2.0, 1.0)):
        store.append_record(tmp_path, store.result_record(_result(plan, step=step)))
    frame = pd.read_json(tmp_path / store.RESULTS_FILE, lines=True)
    assert len(frame) == 2 and list(frame["step_time_s"]) == [2.0, 1.0]
    rebuilt = [store.plan_from_record(r) for r in frame.to_dict("records")]
    assert rebuilt == PLANS[:2]           # the plan itself is the key: fields round-trip exactly
    plans_csv = pd.read_csv(tmp_path / store.PLANS_FILE)
    assert [store.plan_from_record(r) for r in plans_csv.to_dict("records")] == PLANS


def test_latest_record_wins_and_resume_skips_only_final_plans(tmp_path):
    store.append_record(tmp_path, store.result_record(_result(PLANS[0])))
    store.append_record(tmp_path, store.result_record(_result(PLANS[1], "cancelled", error="x")))
    store.append_record(tmp_path, store.result_record(_result(PLANS[2], "oom", error="OOM")))
    # a plan first cancelled then finished counts as finished
    store.append_record(tmp_path, store.result_record(_result(PLANS[3], "cancelled")))
    store.append_record(tmp_path, store.result_record(_result(PLANS[3], "ok", step=3.0)))
    assert store.pending_plans(tmp_path, PLANS) == [PLANS[1]]
    latest = store.load_results(tmp_path)
    assert len(latest) == 4
    row = latest[(latest["pp"] == 2) & (latest["tp"] == 2)].iloc[0]
    assert row["status"] == "ok" and row["step_time_s"] == 3.0


def test_retry_runs_plans_whose_final_status_it_names(tmp_path):
    statuses = ["ok", "timeout", "oom", "error"]
    for plan, status in zip(PLANS, statuses):
        store.append_record(tmp_path, store.result_record(_result(plan, status, error="x")))
    assert store.pending_plans(tmp_path, PLANS) == []
    assert store.pending_plans(tmp_path, PLANS, ("timeout",)) == [PLANS[1]]
    assert store.pending_plans(tmp_path, PLANS, ("oom", "error")) == PLANS[2:]
    assert store.pending_plans(tmp_path, PLANS, ("failed",)) == PLANS[1:]


def test_retry_flag_reruns_a_timed_out_plan_with_a_longer_limit(tmp_path, monkeypatch):
    """The fault: a timed-out plan could not be retried into the same folder."""
    from autoconfig.profiling import sweep as profiling_sweep
    from autoconfig.profiling.sweep import ProfileOptions
    ran = []

    def fake_launch(items, options, out_dir, on_submitted=None, **kw):
        ran.append((len(items), options.time_limit_min))
        on_submitted()
        for item in items:
            store.append_record(out_dir, store.result_record(
                _result(item.plan, "timeout" if options.time_limit_min < 5 else "ok")))
        return []
    monkeypatch.setattr(profiling_sweep.launch, "launch", fake_launch)
    from autoconfig.core.catalog import get_gpu, get_model
    from autoconfig.core.hardware import Cluster
    from autoconfig.core.plan import Workload
    ranked = [profiling_sweep.RankedPlan(PLANS[0], 1.0, 1.0, 1.0)]
    args = (ranked, get_model("tiny"), Workload(8, 128), Cluster(get_gpu("a100-80gb"), 1, 8))

    def run(minutes, retry=()):
        options = ProfileOptions.from_flags(profile=True, device="cpu", max_minutes=minutes,
                                            top_k=1, retry=retry)
        try:
            profiling_sweep.run_profiling(*args, options, tmp_path, echo=lambda *a, **k: None)
        except Exception as exc:   # noqa: BLE001 - the all-timed-out error carries the advice
            return str(exc)
        return ""
    assert "--retry timeout" in run(1)
    run(10)                                       # without --retry: nothing runs again
    assert ran == [(1, 1), (0, 10)]
    assert run(10, retry=("timeout",)) == ""
    assert ran[-1] == (1, 10)
    assert store.load_results(tmp_path / "profile")["status"].tolist() == ["ok"]


def test_torn_last_line_is_skipped_and_nothing_else_lost(tmp_path):
    store.append_record(tmp_path, store.result_record(_result(PLANS[0])))
    with open(tmp_path / store.RESULTS_FILE, "a") as fh:
        fh.write('{"tp": 2, "pp": 1, "status": "o')   # a crash mid-write
    assert len(store.load_records(tmp_path)) == 1
    assert store.pending_plans(tmp_path, PLANS[:2]) == [PLANS[1]]


def test_append_is_one_line_per_record(tmp_path):
    for plan in PLANS:
        store.append_record(tmp_path, store.result_record(_result(plan)))
    lines = (tmp_path / store.RESULTS_FILE).read_text().splitlines()
    assert len(lines) == len(PLANS) and all(json.loads(line)["status"] == "ok" for line in lines)


def test_write_plans_is_atomic_and_leaves_no_temp_file(tmp_path):
    store.write_plans(tmp_path, _plans_df(PLANS), {"device": "cpu"})
    store.write_plans(tmp_path, _plans_df(PLANS[:1]), {"device": "cpu"})
    assert sorted(os.listdir(tmp_path)) == [store.META_FILE, store.PLANS_FILE]
    assert len(pd.read_csv(tmp_path / store.PLANS_FILE)) == 1


def test_report_ranks_by_objective_and_lists_failures(tmp_path):
    store.write_plans(tmp_path, _plans_df(PLANS), {"device": "cuda", "objective": "throughput"})
    for plan, step in zip(PLANS[:3], (2.0, 1.0, 4.0)):
        r = _result(plan, step=step)
        store.append_record(tmp_path, store.result_record(r) | {"device": "cuda"})
    store.append_record(tmp_path, store.result_record(
        _result(PLANS[3], "timeout", error="line one\nJob timed-out")))
    csv_path, md_path, table = write_report(tmp_path, "throughput")
    ok = table[table["status"] == "ok"].sort_values("measured_rank")
    assert list(ok["step_time_s"]) == [1.0, 2.0, 4.0]
    # error of the prediction, in percent of the measurement (plan 2: 1.0 s predicted, 1.0 measured)
    assert ok.iloc[0]["step_time_error_pct"] == pytest.approx(0.0)
    assert ok.iloc[1]["step_time_error_pct"] == pytest.approx(-75.0)
    text = md_path.read_text()
    assert "timeout" in text and "Job timed-out" in text
    assert len(pd.read_csv(csv_path)) == 4
    _, _, latency = write_report(tmp_path, "latency")
    assert list(latency[latency["status"] == "ok"].sort_values("measured_rank")["step_time_s"]) \
        == [1.0, 2.0, 4.0]


def test_report_of_an_all_failed_store_says_so(tmp_path):
    store.write_plans(tmp_path, _plans_df(PLANS), {"device": "cpu"})
    store.append_record(tmp_path, store.result_record(_result(PLANS[0], "oom", error="CUDA OOM")))
    store.append_record(tmp_path, store.result_record(_result(PLANS[1], "error", error="boom")))
    _, md_path, table = write_report(tmp_path)
    text = md_path.read_text()
    assert "Every one of the 2 profiling jobs failed" in text
    assert "recompute" in text          # the oom advice
    assert "not gpu figures" in text.lower()    # device cpu
    assert table["measured_rank"].isna().all()


def test_report_of_an_empty_store_does_not_crash(tmp_path):
    _, md_path, table = write_report(tmp_path)
    assert table.empty and "No profiling job has reported" in md_path.read_text()


def _records(tmp_path, plans):
    for plan in plans:
        store.append_record(tmp_path, store.result_record(_result(plan)))


def test_append_after_a_torn_line_starts_a_new_line(tmp_path):
    """A crash mid-write leaves a torn last line; the resumed run's record must
    not be glued onto it (it was, and the measurement was lost)."""
    _records(tmp_path, PLANS[:1])
    with open(tmp_path / store.RESULTS_FILE, "a") as handle:
        handle.write('{"tp": 2, "pp": 1, "st')          # torn: no newline
    store.append_record(tmp_path, store.result_record(_result(PLANS[1])))
    got = {store.plan_from_record(r) for r in store.load_records(tmp_path)}
    assert got == set(PLANS[:2])
    warning = store.check_store(tmp_path)
    assert "1 unusable line(s)" in warning and "line 2" in warning
    assert (tmp_path / store.CORRUPT_FILE).read_text() == '{"tp": 2, "pp": 1, "st\n'


@pytest.mark.parametrize("line, why", [
    ("garbage that is not json", "not JSON"),
    ("[1, 2, 3]", "not a JSON object"),
    ('{"tp": 1, "pp": 1, "dp": 4, "status": "bogus"}', "unknown status"),
    ('{"tp": 1, "pp": 1, "dp": 4, "status": "ok", "step_time_s": -1.0}', "step_time_s -1.0"),
    ('{"tp": 1, "pp": 1, "dp": 4, "status": "ok", "step_time_s": NaN}', "step_time_s nan"),
    ('{"tp": "x", "pp": 1, "dp": 4, "status": "ok", "step_time_s": 1.0}', "plan fields"),
])
def test_invalid_lines_are_kept_aside_counted_and_never_ranked(tmp_path, line, why):
    _records(tmp_path, PLANS[:1])
    with open(tmp_path / store.RESULTS_FILE, "a") as handle:
        handle.write(line + "\n")
    _records(tmp_path, PLANS[1:2])
    assert len(store.load_records(tmp_path)) == 2          # both good records survive
    results = store.load_results(tmp_path)
    assert (results["step_time_s"] > 0).all()
    warning = store.check_store(tmp_path)
    assert why in warning and len(warning.splitlines()) == 1
    assert (tmp_path / store.CORRUPT_FILE).read_text() == line + "\n"
    assert line in (tmp_path / store.RESULTS_FILE).read_text()   # nothing deleted


def test_non_utf8_bytes_do_not_stop_the_store(tmp_path):
    _records(tmp_path, PLANS[:1])
    with open(tmp_path / store.RESULTS_FILE, "ab") as handle:
        handle.write(b"\xff\xfe\x00garbage\n")
    _records(tmp_path, PLANS[1:2])
    assert len(store.load_records(tmp_path)) == 2
    assert "1 unusable" in store.check_store(tmp_path)


def test_report_command_warns_about_unusable_lines(tmp_path, capsys):
    from tests.cli_runner import run_cli
    store.write_plans(tmp_path, _plans_df(PLANS[:2]), {"model": "tiny"})
    _records(tmp_path, PLANS[:1])
    with open(tmp_path / store.RESULTS_FILE, "a") as handle:
        handle.write("not a record\n")
    code, out, err = run_cli(["report", str(tmp_path)], capsys)
    assert code == 0, err
    assert "1 unusable line(s)" in err and "Traceback" not in err
