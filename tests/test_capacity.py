"""Capacity planning: one search per (GPU, nodes) cell, priced on the token budget."""

import subprocess
import sys

import pandas as pd
import pytest

from autoconfig.training.capacity import capacity_grid, train_days
from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.errors import InputError
from autoconfig.core.plan import Workload


@pytest.fixture(scope="module")
def cells():
    model = get_model("gpt3", "6.7b")
    workload = Workload(global_batch_size=512, seq_len=2048, precision="fp8")
    gpus = [get_gpu("a100-80gb"), get_gpu("h100")]
    return capacity_grid(model, workload, gpus, [1, 4, 16], tokens=300e9)


def test_one_cell_per_gpu_and_node_count_in_order(cells):
    assert [(c.gpu, c.nodes) for c in cells] == [
        ("a100-80gb", 1), ("a100-80gb", 4), ("a100-80gb", 16),
        ("h100-80gb", 1), ("h100-80gb", 4), ("h100-80gb", 16)]


def test_fp8_on_a100_is_unsupported_not_dropped(cells):
    a100 = [c for c in cells if c.gpu == "a100-80gb"]
    assert {c.status for c in a100} == {"unsupported"}
    assert all("FP8" in c.reason for c in a100)


def test_nvfp4_runs_only_where_the_gpu_has_fp4_tensor_cores():
    """H100 (no FP4) and B300 (no confirmed FP4 peak) cells are unsupported with the
    reason; a GB200 cell is searched and beats its own MXFP8 cell."""
    model = get_model("llama3", "8b")
    gpus = [get_gpu("h100"), get_gpu("b300"), get_gpu("gb200")]
    nvfp4 = capacity_grid(model, Workload(256, 8192, "nvfp4"), gpus, [8], tokens=1e12)
    assert [(c.gpu, c.status) for c in nvfp4] == [
        ("h100-80gb", "unsupported"), ("b300", "unsupported"), ("gb200", "ok")]
    assert all("NVFP4" in c.reason for c in nvfp4[:2])
    fp8 = capacity_grid(model, Workload(256, 8192, "fp8"), gpus[2:], [8], tokens=1e12)
    assert nvfp4[2].tokens_per_s > fp8[0].tokens_per_s


def test_days_price_the_budget_at_the_best_plans_rate(cells):
    for c in (c for c in cells if c.status == "ok"):
        assert c.plan.num_gpus == c.gpus
        assert c.tokens_per_s == pytest.approx(c.tokens_per_s_per_gpu * c.gpus)
        assert c.train_days * 86400 * c.tokens_per_s == pytest.approx(300e9)
        assert c.gpu_hours == pytest.approx(c.train_days * 24 * c.gpus)


def test_more_nodes_train_faster(cells):
    h100 = [c for c in cells if c.gpu == "h100-80gb" and c.status == "ok"]
    assert len(h100) == 3
    days = [c.train_days for c in h100]
    assert days == sorted(days, reverse=True) and days[0] > days[-1]


def test_a_cell_where_nothing_fits_keeps_the_reason():
    model = get_model("gpt3", "175b")
    cells = capacity_grid(model, Workload(1536, 2048), [get_gpu("a100-40gb")], [1], 300e9)
    assert cells[0].status == "infeasible" and "would fit" in cells[0].reason


def test_an_infeasible_cells_reason_stands_where_its_plan_would():
    """capacity.md keeps text out of the number columns (GPU-hours)."""
    from autoconfig.reports.capacity_report import markdown
    model = get_model("gpt3", "175b")
    cells = capacity_grid(model, Workload(1536, 2048), [get_gpu("a100-40gb")], [1], 300e9)
    table = [line for line in markdown(cells, "t", []).splitlines() if "a100-40gb" in line]
    fields = [f.strip() for f in table[0].strip("|").split("|")]
    assert fields[3] == "infeasible" and fields[4].startswith("no plan fits")
    assert fields[5:] == [""] * 6


def test_bad_grids_are_input_errors():
    model = get_model("gpt3", "1.3b")
    with pytest.raises(InputError, match="invalid --nodes 0"):
        capacity_grid(model, Workload(512, 2048), [get_gpu("h100")], [0], 1e9)
    with pytest.raises(InputError, match="at least one"):
        capacity_grid(model, Workload(512, 2048), [], [1], 1e9)


def test_train_days():
    assert train_days(86400.0 * 10, 10.0) == pytest.approx(1.0)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "autoconfig", "capacity", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_writes_csv_and_markdown(tmp_path):
    proc = _cli("--model", "gpt3", "--size", "1.3b", "--gpu", "a100,h100", "--nodes", "1,2",
                "--tokens", "26b", "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    df = pd.read_csv(tmp_path / "capacity.csv")
    assert list(zip(df.gpu, df.nodes)) == [("a100-80gb", 1), ("a100-80gb", 2),
                                          ("h100-80gb", 1), ("h100-80gb", 2)]
    assert (df.status == "ok").all() and (df.train_days > 0).all()
    text = (tmp_path / "capacity.md").read_text()
    assert text.startswith("# Capacity plan: gpt3-1.3b") and "GPU-hours" in text


@pytest.mark.parametrize("args,needle", [
    (("--model", "gpt3", "--size", "1.3b", "--nodes", "0"), "--nodes '0'"),
    (("--model", "gpt3", "--size", "1.3b", "--nodes", "2", "--gpu", "v100"), "unknown GPU 'v100'"),
    (("--model", "gpt3", "--size", "1.3b", "--nodes", "2", "--tokens", "lots"), "--tokens 'lots'"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, needle, tmp_path):
    proc = _cli(*args, "-o", str(tmp_path))
    assert proc.returncode == 2
    assert needle in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_a_grid_where_nothing_trains_writes_the_report_and_fails(tmp_path):
    """A nightly capacity job must see it; the report still says why per cell."""
    out = tmp_path / "cap"
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "capacity", "--model", "gpt3",
                           "--size", "175b", "--gpu", "a100-40gb", "--gpus", "8", "--no-plots",
                           "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: no cell of the grid can train the model (reasons in capacity.md): give more "
        "nodes, another GPU, or a smaller model"]
    assert "no plan fits" in (out / "capacity.md").read_text()


@pytest.mark.parametrize("gpus", ["", "h100,,a100-80gb", " , "])
def test_an_empty_gpu_in_the_list_is_one_line(tmp_path, gpus):
    proc = subprocess.run([sys.executable, "-m", "autoconfig", "capacity", "--model", "tiny",
                           "--gpu", gpus, "--gpus", "8", "--no-plots", "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: invalid --gpu {gpus!r}: expected GPU types separated by commas, e.g. "
        "a100-80gb,h100 (see `autoconfig catalog`)"]
