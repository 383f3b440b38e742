"""autoconfig capacity with cost, energy and carbon: every figure of the CSV
re-derived by hand from its columns and from the datasheet numbers."""


import pandas as pd
import pytest

from autoconfig.core.catalog import get_gpu
from cli_runner import cli as autoconfig_cli

COMMAND = ["capacity", "--model", "llama3", "--size", "70b", "--gpu", "a100,h100,b200",
           "--nodes", "16,64,256", "--tokens", "15t", "--price", "h100=2.5,a100=1.5,b200=4",
           "--grid-kg-per-kwh", "0.4"]
# Typed from the datasheets (not read from the catalog): board TDP in W, and the
# DGX system's maximum power in W minus its 8 GPUs at TDP = non-GPU watts per node.
TDP_W = {"a100-80gb": 400, "h100-80gb": 700, "b200": 1000}
NODE_OVERHEAD_W = {"a100-80gb": 6500 - 8 * 400, "h100-80gb": 10200 - 8 * 700,
                   "b200": 14300 - 8 * 1000}
PRICE = {"a100-80gb": 1.5, "h100-80gb": 2.5, "b200": 4.0}
PUE, FRACTION, GRID = 1.58, 1.0, 0.4


def cli(*args):
    return autoconfig_cli(*args, timeout=300)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("cap")
    proc = cli(*COMMAND, "-o", out)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout, pd.read_csv(out / "capacity.csv"), out


def test_every_figure_rederived_by_hand(report):
    _, df, _ = report
    assert len(df) == 9 and set(df["status"]) == {"ok"}
    for row in df.itertuples(index=False):
        hours = 15e12 / row.tokens_per_s / 3600
        assert row.tokens == 15e12
        assert row.tokens_per_s == pytest.approx(row.tokens_per_s_per_gpu * row.gpus)
        assert row.train_days == pytest.approx(hours / 24)
        assert row.gpu_hours == pytest.approx(hours * row.gpus)
        assert row.price_usd_per_gpu_hour == PRICE[row.gpu]
        assert row.cost_usd == pytest.approx(hours * row.gpus * PRICE[row.gpu])
        assert row.tdp_w == TDP_W[row.gpu] and row.gpu_power_w == TDP_W[row.gpu] * FRACTION
        assert row.node_overhead_w == pytest.approx(NODE_OVERHEAD_W[row.gpu])
        assert row.pue == PUE and row.grid_kg_per_kwh == GRID
        kwh = (row.gpus * TDP_W[row.gpu] * FRACTION + row.nodes * NODE_OVERHEAD_W[row.gpu]) \
            * hours / 1000 * PUE
        assert row.energy_kwh == pytest.approx(kwh)
        assert row.energy_mwh == pytest.approx(kwh / 1000)
        assert row.co2_t == pytest.approx(kwh * GRID / 1000)
    assert df["fastest"].sum() == 1 and df["cheapest"].sum() == 1
    assert df.loc[df["fastest"], "train_days"].item() == df["train_days"].min()
    assert df.loc[df["cheapest"], "cost_usd"].item() == df["cost_usd"].min()


def test_printed_table_marks_fastest_and_cheapest(report):
    stdout, df, out = report
    for header in ("days", "GPU-hours", "cost USD", "MWh", "t CO2"):
        assert header in stdout
    assert stdout.count("**fastest**") == 1 and stdout.count("**cheapest**") == 1
    fastest = df[df["fastest"]].iloc[0]
    line = next(l for l in stdout.splitlines() if "**fastest**" in l)
    assert fastest["gpu"] in line and f" {fastest['nodes']} " in line
    assert f"{df['co2_t'].iloc[0]:,.1f}" in stdout
    assert (out / "capacity_scaling.png").is_file() and (out / "capacity_cost_vs_days.png").is_file()
    assert "](capacity_cost_vs_days.png)" in (out / "capacity.md").read_text()


def test_overrides_change_exactly_their_term(tmp_path):
    proc = cli("capacity", "--model", "gpt3", "--size", "1.3b", "--gpu", "h100", "--nodes", "2",
               "--tokens", "26b", "--gpu-power-fraction", "0.5", "--node-overhead-w", "1000",
               "--pue", "1.1", "-o", tmp_path, "--no-plots")
    assert proc.returncode == 0, proc.stderr
    row = pd.read_csv(tmp_path / "capacity.csv").iloc[0]
    hours = row.train_days * 24
    assert row.energy_kwh == pytest.approx((16 * 350 + 2 * 1000) * hours / 1000 * 1.1)
    assert pd.isna(row.cost_usd) and pd.isna(row.co2_t) and not row.cheapest
    assert not list(tmp_path.glob("*.png"))


def test_catalog_tdp_is_sourced_for_every_gpu():
    for name, watts in {"a100-80gb": 400, "a100-40gb": 400, "h100": 700, "h200": 700,
                        "b200": 1000, "gb200": 1350}.items():
        assert get_gpu(name).tdp_w == watts


@pytest.mark.parametrize("args, message", [
    (["--price", "h100"], "invalid --price 'h100': expected GPU=USD"),
    (["--price", "v100=2"], "unknown GPU 'v100'"),
    (["--pue", "0.9"], "invalid --pue 0.9: must be at least 1"),
    (["--gpu-power-fraction", "0"], "invalid --gpu-power-fraction 0"),
    (["--grid-kg-per-kwh", "-1"], "invalid --grid-kg-per-kwh -1"),
    # a GPU priced twice took the last price; a price of a GPU not asked was dropped
    (["--price", "h100=2,h100-80gb=3"], "h100-80gb priced twice"),
    (["--price", "a100-40gb=1"], "a100-40gb is not among --gpu (h100-80gb)"),
])
def test_bad_cost_flags_are_one_line_errors(args, message):
    proc = cli("capacity", "--model", "gpt3", "--size", "1.3b", "--gpu", "h100", "--nodes", "1",
               "--no-plots", *args)
    assert proc.returncode == 2 and message in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["--gpu", "h100,h100-80gb", "--nodes", "1"], "invalid --gpu 'h100,h100-80gb': h100-80gb "
                                                  "given twice"),
    (["--gpu", "h100", "--nodes", "1,2,1"], "invalid --nodes '1,2,1': 1 given twice"),
    (["--gpu", "h100", "--gpus", "8,8"], "invalid --gpus '8,8': 8 given twice"),
])
def test_a_cell_asked_twice_is_refused_not_printed_twice(args, message):
    proc = cli("capacity", "--model", "gpt3", "--size", "1.3b", "--no-plots", *args)
    assert proc.returncode == 2 and message in proc.stderr
