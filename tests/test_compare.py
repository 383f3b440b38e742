"""autoconfig compare: settings matched by key; regressions, infeasible settings and
settings present in only one run; exit status."""

import json
import shutil
from pathlib import Path

import pytest
import yaml

from autoconfig.sweep.compare import compare_runs
from autoconfig.sweep.run import SETTINGS_DIR
from cli_runner import cli

SWEEP = {"name": "cmp", "matrix": {"model": [{"model": "gpt3", "size": "1.3b"}],
                                   "gpu": ["h100", "a100-80gb"], "nodes": [1, 2]}}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("cmp")
    path = base / "sweep.yaml"
    path.write_text(yaml.safe_dump(SWEEP))
    proc = cli("sweep", path, "-o", base / "old", "--no-plots")
    assert proc.returncode == 0, proc.stderr
    return base / "old"


def _files(run_dir: Path) -> dict[str, Path]:
    out = {}
    for path in (run_dir / SETTINGS_DIR).glob("*.json"):
        out[json.loads(path.read_text())["key"]] = path
    return out


def _edit(path: Path, fn) -> None:
    record = json.loads(path.read_text())
    fn(record)
    path.write_text(json.dumps(record))


def test_identical_runs_exit_0(run, tmp_path):
    summary = tmp_path / "summary.md"
    proc = cli("compare", run, run, "--markdown", summary)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no regression beyond 5%" in proc.stdout
    assert "unchanged: 4" in summary.read_text()


@pytest.mark.parametrize("threshold", ["nan", "inf", "-1"])
def test_a_threshold_that_would_pass_anything_is_refused(run, threshold):
    proc = cli("compare", run, run, "--threshold", threshold)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"invalid --threshold {threshold}: must be at least 0 and finite" in proc.stderr
    with pytest.raises(Exception, match="--threshold nan"):
        compare_runs({}, {}, float("nan"))


def test_regression_infeasible_and_one_sided_settings(run, tmp_path):
    new = tmp_path / "new"
    shutil.copytree(run, new)
    files = _files(new)
    keys = sorted(files)
    # keys are matched, not rows: shuffle the file names' order by renaming one
    slower, broken, dropped = keys[0], keys[1], keys[2]

    def slow(r):
        r["best"]["predicted"]["tokens_per_s_per_gpu"] *= 0.80

    _edit(files[slower], slow)
    _edit(files[broken], lambda r: r.update(status="infeasible", best=None,
                                            reason="no plan fits in 1 GiB"))
    files[dropped].unlink()
    extra = json.loads(files[keys[3]].read_text())
    extra["key"] = "only-new|h100-80gb|9n"
    (new / SETTINGS_DIR / "only-new.json").write_text(json.dumps(extra))

    summary = tmp_path / "summary.md"
    proc = cli("compare", run, new, "--threshold", "10", "--markdown", summary)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = summary.read_text()
    assert text == proc.stdout.rstrip("\n") + "\n" or text.strip() == proc.stdout.strip()
    assert "**2 regression(s)** beyond 10%" in text
    assert "-20.00%" in text and "became infeasible" in text and "no plan fits" in text
    assert "only in old" in text and "only in new" in text
    # a key's '|' is escaped: every row of the table has the header's cells
    assert "only-new\\|h100-80gb\\|9n" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    cells = {len(line.replace("\\|", "").split("|")) for line in table}
    assert len(table) > 3 and len(cells) == 1

    # a 20% drop passes a 25% threshold; the infeasible setting still fails
    from autoconfig.sweep.compare import load_run
    cmp = compare_runs(load_run(run), load_run(new), threshold_pct=25)
    assert [c.kind for c in cmp.regressions] == ["became infeasible"]
    kinds = {c.key: c.kind for c in cmp.changes}
    assert kinds[dropped] == "only in old" and kinds["only-new|h100-80gb|9n"] == "only in new"
    assert not any(c.regression for c in cmp.changes if c.kind.startswith("only"))


def test_measured_beats_predicted_where_both_runs_measured(run):
    from autoconfig.sweep.compare import load_run
    old, new = load_run(run), load_run(run)
    key = sorted(old)[0]
    old[key] = {**old[key], "measured": {"tokens_per_s_per_gpu": 100.0}}
    new[key] = json.loads(json.dumps(old[key]))
    new[key]["measured"]["tokens_per_s_per_gpu"] = 50.0          # measured: -50%
    new[key]["best"]["predicted"]["tokens_per_s_per_gpu"] *= 1.5  # predicted: +50%
    change = {c.key: c for c in compare_runs(old, new, 5).changes}[key]
    assert change.basis == "measured" and change.regression
    assert change.measured_change_pct == pytest.approx(-50)
    assert change.predicted_change_pct == pytest.approx(50)


def test_either_way_fails_on_a_rise_too(run):
    from autoconfig.sweep.compare import load_run
    old, new = load_run(run), load_run(run)
    key = sorted(old)[0]
    new[key] = json.loads(json.dumps(new[key]))
    new[key]["best"]["predicted"]["tokens_per_s_per_gpu"] *= 1.2
    assert not compare_runs(old, new, 5).regressions
    assert [c.kind for c in compare_runs(old, new, 5, either_way=True).regressions] == \
        ["improved"]


def test_compare_of_a_non_run_is_a_one_line_error(tmp_path):
    proc = cli("compare", tmp_path, tmp_path)
    assert proc.returncode == 2 and "not a sweep run directory" in proc.stderr
