"""The inference GPUs of the catalog (L40S, L4, H20, A10G): their figures load as
their YAML files state them, keep the physical relations of their architecture,
and every command that looks a GPU generation up (estimate, infer, the FP8
recipes, the default efficiency) runs on them."""

import json

import pytest

from autoconfig.base import budget as bud
from autoconfig.core import catalog
from autoconfig.errors import InputError
from autoconfig.paths import configs_dir
from autoconfig.training import fp8
from autoconfig.training.step_time import load_constants
from autoconfig.yamlio import load_yaml
from cli_runner import run_cli

INFERENCE_GPUS = ("l40s", "l4", "h20", "a10g")
PCIE_CARDS = ("l40s", "l4", "a10g")
"""Cards without NVLink: their in-node link is PCIe Gen4 x16."""
PCIE_GEN4_X16_BIDIRECTIONAL_GB_PER_S = 64
"""PCI-SIG PCIe 4.0: 16 GT/s x 16 lanes, 128b/130b, about 32 GB/s each way."""
FIELDS = ("peak_bf16_tflops", "peak_fp8_tflops", "peak_fp16_vector_tflops", "hbm_capacity_gb",
          "hbm_bandwidth_gb_per_s", "nvlink_bandwidth_gb_per_s", "gpus_per_node",
          "nvlink_domain_gpus", "internode_bandwidth_gb_per_s", "sm_count", "tdp_w",
          "node_power_w", "generation")


def stated(name: str) -> dict:
    """{field: value} as configs/gpus/<name>.yaml states it."""
    data = load_yaml(configs_dir() / "gpus" / f"{name}.yaml")
    return {key: data[key]["value"] for key in FIELDS}


def sources(name: str) -> dict:
    data = load_yaml(configs_dir() / "gpus" / f"{name}.yaml")
    return {key: str(data[key]["source"]) for key in FIELDS}


# ---------------------------------------------------------------- the catalog


@pytest.mark.parametrize("name", INFERENCE_GPUS)
def test_loads_with_the_figures_its_file_states(name) -> None:
    gpu = catalog.get_gpu(name)
    assert gpu.name == name
    for key, value in stated(name).items():
        assert getattr(gpu, key) == value, key
    for alias in gpu.aliases:
        assert catalog.get_gpu(alias) == gpu
    assert catalog.get_gpu(name.upper()) == gpu
    assert all(text.strip() for text in sources(name).values())
    assert name in {g.name for g in catalog.all_gpus()}


@pytest.mark.parametrize("name", INFERENCE_GPUS)
def test_physical_relations(name) -> None:
    gpu = catalog.get_gpu(name)
    if gpu.generation in ("ada", "hopper"):
        # FP8 tensor cores run twice the dense BF16 rate (Ada whitepaper, Hopper datasheets).
        assert gpu.peak_fp8_tflops == pytest.approx(2 * gpu.peak_bf16_tflops, rel=0.01)
        assert gpu.peak_tflops("fp8") == gpu.peak_fp8_tflops
    else:
        assert gpu.generation == "ampere"
        assert gpu.peak_fp8_tflops is None
        with pytest.raises(InputError, match="fp8"):
            gpu.peak_tflops("fp8")
    assert gpu.peak_tflops("bf16") == gpu.peak_bf16_tflops
    # The in-node link is slower than the GPU's memory, the network no faster than it.
    assert gpu.internode_bandwidth_gb_per_s <= gpu.nvlink_bandwidth_gb_per_s
    assert gpu.nvlink_bandwidth_gb_per_s < gpu.hbm_bandwidth_gb_per_s
    assert gpu.gpus_per_node <= gpu.nvlink_domain_gpus
    assert gpu.peak_fp16_vector_tflops is None or \
        gpu.peak_fp16_vector_tflops < gpu.peak_bf16_tflops
    if name in PCIE_CARDS:
        assert gpu.nvlink_bandwidth_gb_per_s == PCIE_GEN4_X16_BIDIRECTIONAL_GB_PER_S / 2
        assert "PCIe, not NVLink" in sources(name)["nvlink_bandwidth_gb_per_s"]
    else:
        assert gpu.nvlink_bandwidth_gb_per_s > PCIE_GEN4_X16_BIDIRECTIONAL_GB_PER_S


def test_generations() -> None:
    assert {n: catalog.get_gpu(n).generation for n in INFERENCE_GPUS} == {
        "l40s": "ada", "l4": "ada", "h20": "hopper", "a10g": "ampere"}
    # H20: the Hopper die throttled to about 15% of the H100's tensor rate, with more HBM.
    h20, h100 = catalog.get_gpu("h20"), catalog.get_gpu("h100")
    assert h20.peak_bf16_tflops < 0.2 * h100.peak_bf16_tflops
    assert h20.hbm_bandwidth_gb_per_s > h100.hbm_bandwidth_gb_per_s
    assert h20.nvlink_bandwidth_gb_per_s == h100.nvlink_bandwidth_gb_per_s


# ------------------------------------------------- what a generation looks up


@pytest.mark.parametrize("name", INFERENCE_GPUS)
def test_step_time_constants_cover_the_generation(name) -> None:
    gpu = catalog.get_gpu(name)
    constants = load_constants()
    assert 0 < constants.efficiency_max(gpu) <= 1
    for kernel in ("fused", "llm-foundry"):
        assert 0 < constants.attention_efficiency_of(gpu, kernel) <= 1


def test_ada_takes_amperes_constants_until_ada_rows_exist() -> None:
    """Ada feeds its tensor cores the Ampere way (mma.sync, FlashAttention-2)."""
    constants = load_constants()
    ada, ampere = catalog.get_gpu("l40s"), catalog.get_gpu("a100")
    assert constants.efficiency_max(ada) == constants.efficiency_max(ampere)
    assert constants.attention_efficiency_of(ada) == constants.attention_efficiency_of(ampere)


@pytest.mark.parametrize("name", INFERENCE_GPUS)
def test_default_efficiency_is_sourced(name) -> None:
    gpu = catalog.get_gpu(name)
    assert 0 < bud.default_utilisation(name, "bf16", False).value <= 1
    if gpu.peak_fp8_tflops:
        assert 0 < bud.default_utilisation(name, "fp8", False).value <= 1


def test_fp8_recipes_on_ada() -> None:
    """Transformer Engine runs per-tensor FP8 (delayed, current) on sm89, not block scaling."""
    l40s = catalog.get_gpu("l40s")
    assert fp8.default_recipe("ada") == "tensorwise"
    assert fp8.run_recipe("", l40s) == "tensorwise"
    assert fp8.run_recipe("delayed", l40s) == "delayed"
    for recipe in ("mxfp8", "blockwise"):
        with pytest.raises(InputError, match=f"invalid --fp8-recipe {recipe} on l40s"):
            fp8.run_recipe(recipe, l40s)
    assert fp8.run_recipe("blockwise", catalog.get_gpu("h20")) == "blockwise"


# ---------------------------------------------------------------- the commands


@pytest.mark.parametrize("name", INFERENCE_GPUS)
def test_estimate_runs(name, capsys) -> None:
    precision = "fp8" if catalog.get_gpu(name).peak_fp8_tflops else "bf16"
    code, out, err = run_cli(["estimate", "--model", "llama3", "--size", "8b", "--gpu", name,
                              "--nodes", "1", "--gbs", "64", "--tp", "8",
                              "--precision", precision], capsys)
    assert code == 0, err
    assert f"8 x {name}" in out and "step time" in out


@pytest.mark.parametrize("name", INFERENCE_GPUS)
def test_infer_runs(name, capsys, tmp_path) -> None:
    code, out, err = run_cli(["infer", "--model", "llama3", "--size", "8b", "--gpu", name,
                              "--gpus", "8", "--input-len", "512", "--output-len", "128",
                              "--no-plots", "--format", "json", "-o", str(tmp_path)], capsys)
    assert code == 0, err
    assert "Traceback" not in err
    result = json.loads((tmp_path / "infer.json").read_text())
    assert result["gpu"] == name
    assert (tmp_path / "infer.csv").exists()


@pytest.mark.parametrize("name", ["l40s", "h20"])
def test_infer_fp8_runs_where_the_gpu_has_fp8(name, capsys, tmp_path) -> None:
    code, _, err = run_cli(["infer", "--model", "llama3", "--size", "8b", "--gpu", name,
                            "--gpus", "8", "--input-len", "512", "--output-len", "128",
                            "--precision", "fp8", "--no-plots", "-o", str(tmp_path)], capsys)
    assert code == 0, err


def test_fp8_is_refused_on_a10g(capsys, tmp_path) -> None:
    code, out, err = run_cli(["infer", "--model", "llama3", "--size", "8b", "--gpu", "a10g",
                              "--gpus", "8", "--input-len", "512", "--output-len", "128",
                              "--precision", "fp8", "--no-plots", "-o", str(tmp_path)], capsys)
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "fp8" in lines[0] and "a10g" in lines[0], err
    assert "Traceback" not in err


def test_gddr6_boards_hold_what_cuda_reports_with_ecc_on() -> None:
    """A 48 GB L40S gives 45,589 MiB to CUDA: inline ECC keeps a sixteenth of its
    GDDR6 (46,080 MiB left) and the driver a little more; HBM boards keep the
    datasheet rule (80 GiB less the driver's 1%)."""
    from autoconfig.training.memory import usable_bytes
    for name in ("l40s", "l4", "a10g"):
        gpu = catalog.get_gpu(name)
        usable = usable_bytes(gpu)
        assert usable == gpu.cuda_memory_mib * 2**20
        assert 0.9 < usable / (gpu.hbm_capacity_gb * 2**30) < 15 / 16
    h100 = catalog.get_gpu("h100-80gb")
    assert h100.cuda_memory_mib is None
    assert usable_bytes(h100) == pytest.approx(0.99 * 80 * 2**30)


def test_the_catalog_lists_the_memory_a_process_can_fill(capsys) -> None:
    code, out, _ = run_cli(["catalog", "gpus"], capsys)
    assert code == 0 and "usable GiB" in out
    l40s = next(line for line in out.splitlines() if line.startswith("l40s "))
    h100 = next(line for line in out.splitlines() if line.startswith("h100-80gb "))
    assert " 44.5 " in l40s and " 79.2 " in h100
