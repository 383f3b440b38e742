"""PNG plots: written next to the CSV, linked from the markdown, never loaded with
--no-plots, never blocking a report when they fail."""

import subprocess
import sys

import pandas as pd
import pytest

from autoconfig.reports import plots

PNG = b"\x89PNG\r\n\x1a\n"
SWEEP = """
matrix:
  model: [{model: gpt3, size: 1.3b}]
  gpu: [h100, a100-80gb]
  nodes: [1, 2]
"""


def _png(path) -> bool:
    return path.is_file() and path.stat().st_size > 100 and path.read_bytes()[:8] == PNG


def _run_in_process(args: list[str]) -> subprocess.CompletedProcess:
    """Run the CLI in a fresh interpreter and report whether matplotlib was imported."""
    code = ("import sys\nfrom autoconfig.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as exc:\n    assert not exc.code, exc.code\n"
            "print('MATPLOTLIB', 'matplotlib' in sys.modules)\n")
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          timeout=300)


def _commands(tmp_path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP)
    return {
        "search": ["search", "--model", "gpt3", "--size", "1.3b", "--nodes", "1", "-o",
                   str(tmp_path / "search")],
        "capacity": ["capacity", "--model", "gpt3", "--size", "1.3b", "--gpu", "h100,a100",
                     "--nodes", "1,2", "--tokens", "26b", "--price", "h100=2,a100=1", "-o",
                     str(tmp_path / "capacity")],
        "sweep": ["sweep", str(sweep), "-o", str(tmp_path / "sweep")],
    }


EXPECTED = {"search": (plots.SEARCH_SCATTER, plots.SEARCH_BREAKDOWN, "report.md"),
            "capacity": (plots.CAPACITY_SCALING, plots.CAPACITY_COST, "capacity.md"),
            "sweep": (plots.SWEEP_SCALING, "sweep.md")}


@pytest.mark.parametrize("command", ["search", "capacity", "sweep"])
def test_plots_written_and_linked(tmp_path, command):
    proc = _run_in_process(_commands(tmp_path)[command])
    assert proc.returncode == 0, proc.stderr
    assert "MATPLOTLIB True" in proc.stdout
    *pngs, markdown = EXPECTED[command]
    out = tmp_path / command
    for name in pngs:
        assert _png(out / name), name
        assert f"]({name})" in (out / markdown).read_text()


@pytest.mark.parametrize("command", ["search", "capacity", "sweep"])
def test_no_plots_never_imports_matplotlib(tmp_path, command):
    proc = _run_in_process(_commands(tmp_path)[command] + ["--no-plots"])
    assert proc.returncode == 0, proc.stderr
    assert "MATPLOTLIB False" in proc.stdout
    assert not list((tmp_path / command).glob("*.png"))


def test_a_failing_plot_never_blocks_the_report(tmp_path, monkeypatch, capsys):
    from autoconfig.sweep.spec import parse_sweep
    from autoconfig.sweep.run import run_sweep
    from autoconfig.sweep.summary import write_summary
    import yaml

    def broken(*args, **kwargs):
        raise RuntimeError("no display")

    monkeypatch.setattr(plots, "sweep_plots", broken)
    spec = parse_sweep(yaml.safe_load(SWEEP))
    records = run_sweep(spec, tmp_path, echo=lambda text: None)
    files = write_summary(tmp_path, records, "t")
    assert files["csv"].is_file() and files["markdown"].is_file() and files["json"].is_file()
    assert "warning: plots not written (RuntimeError: no display)" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.png"))


def test_profile_plot_predicted_vs_measured(tmp_path):
    table = pd.DataFrame({"plan": ["tp1 pp1 dp2", "tp2 pp1 dp1 sp", "tp1 pp2 dp1"],
                          "status": ["ok", "ok", "oom"],
                          "step_time_s": [0.5, 0.7, None],
                          "predicted_step_time_s": [0.4, 0.6, 0.3]})
    [path] = plots.profile_plots(table, tmp_path)
    assert path.name == plots.PROFILE_PLOT and _png(path)
    assert plots.profile_plots(table[table["status"] == "oom"], tmp_path / "none") == []
