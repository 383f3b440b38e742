"""A sweep's results folder: another sweep is refused, corrupt files are named."""

import json
from pathlib import Path

from cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[1]
SMALL = ROOT / "configs" / "sweeps" / "ci-small.yaml"
NIGHTLY = ROOT / "configs" / "sweeps" / "nightly-example.yaml"


def test_another_sweep_into_the_same_folder_is_refused(tmp_path: Path, capsys) -> None:
    """Its records would merge with the first sweep's into one report, under the
    first sweep's manifest."""
    out = tmp_path / "nightly"
    assert run_cli(["sweep", str(SMALL), "-o", str(out), "--no-plots"], capsys)[0] == 0
    records = sorted(p.name for p in (out / "settings").iterdir())
    code, _, err = run_cli(["sweep", str(NIGHTLY), "-o", str(out), "--no-plots"], capsys)
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "'ci-small'" in lines[0] and "nightly-example" in lines[0]
    assert "Traceback" not in err
    assert sorted(p.name for p in (out / "settings").iterdir()) == records
    assert json.loads((out / "manifest.json").read_text())["sweep_name"] == "ci-small"


def test_corrupt_manifest_and_record_are_named_and_rebuilt(tmp_path: Path, capsys) -> None:
    out = tmp_path / "small"
    assert run_cli(["sweep", str(SMALL), "-o", str(out), "--no-plots"], capsys)[0] == 0
    (out / "manifest.json").write_text("{bad")
    record = sorted((out / "settings").iterdir())[0]
    record.write_text(record.read_text()[:30])
    code, _, err = run_cli(["sweep", str(SMALL), "-o", str(out), "--no-plots"], capsys)
    assert code == 0
    assert f"{out / 'manifest.json'} was not a readable manifest" in err
    assert f"{record} is not a readable record" in err
    assert (out / "manifest.json.corrupt").read_text() == "{bad"
    assert json.loads(record.read_text())["status"] in ("ok", "infeasible")
