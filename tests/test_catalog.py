"""Catalog loading: every shipped YAML loads, validates and carries sources."""

from pathlib import Path

import pytest

from autoconfig.core import catalog
from autoconfig.errors import CatalogError, InputError
from autoconfig.paths import configs_dir


@pytest.mark.parametrize("path", sorted((configs_dir() / "gpus").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_gpu_file_loads(path: Path) -> None:
    gpu = catalog.gpu_from_yaml(path)
    assert gpu.name == path.stem
    # Units (TFLOP/s, decimal GB): the smallest catalog GPUs are the 24 GB inference
    # cards (L4, A10G at 70 TFLOP/s); a figure in the wrong unit is off by 1000.
    assert 50 < gpu.peak_bf16_tflops < 10_000
    assert 16 <= gpu.hbm_capacity_gb <= 1_000
    # Relations every GPU keeps: dense FP8 is twice dense BF16 where there is FP8;
    # the scale-out network is no faster than the in-node link, which is slower than
    # the GPU's own memory; a node fits in its NVLink (or PCIe) domain.
    assert gpu.peak_fp8_tflops is None or \
        gpu.peak_fp8_tflops == pytest.approx(2 * gpu.peak_bf16_tflops, rel=0.01)
    assert gpu.internode_bandwidth_gb_per_s <= gpu.nvlink_bandwidth_gb_per_s \
        < gpu.hbm_bandwidth_gb_per_s
    assert gpu.gpus_per_node <= gpu.nvlink_domain_gpus


@pytest.mark.parametrize("path", sorted((configs_dir() / "models").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_model_file_loads(path: Path) -> None:
    model = catalog.model_from_yaml(path)
    assert model.name == path.stem
    assert model.kv_channels or model.hidden_size % model.num_heads == 0


def test_required_gpus_and_aliases() -> None:
    names = {g.name for g in catalog.all_gpus()}
    assert {"a100-40gb", "a100-80gb", "h100-80gb", "h200", "b200", "gb200"} <= names
    assert catalog.get_gpu("h100").name == "h100-80gb"
    assert catalog.get_gpu("H100").name == "h100-80gb"
    assert catalog.get_gpu("a100-80gb").peak_fp8_tflops is None


def test_model_lookup_by_family_and_size() -> None:
    assert catalog.get_model("gpt3", "175b").num_layers == 96
    assert catalog.get_model("gpt3", "175B").hidden_size == 12288
    assert catalog.get_model("llama3-8b").num_kv_heads == 8
    assert catalog.get_model("llama3", "405b").num_layers == 126


def test_unknown_names_are_input_errors() -> None:
    with pytest.raises(InputError, match="unknown GPU 'v100'"):
        catalog.get_gpu("v100")
    with pytest.raises(InputError, match="unknown model 'gpt5'"):
        catalog.get_model("gpt5", "1b")
    with pytest.raises(InputError, match="invalid size '17x'"):
        catalog.get_model("gpt3", "17x")
    with pytest.raises(InputError, match="unknown size '17b'.*allowed are"):
        catalog.get_model("gpt3", "17b")


def test_number_without_source_is_rejected(tmp_path: Path) -> None:
    src = (configs_dir() / "gpus" / "h100-80gb.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(src.replace('peak_bf16_tflops: {value: 989, source:', 'peak_bf16_tflops: {value: 989, note:'))
    with pytest.raises(CatalogError, match="'peak_bf16_tflops' has no source"):
        catalog.gpu_from_yaml(bad)


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("name: x\nnum_layers: [1, 2\n")
    with pytest.raises(CatalogError, match=r"malformed YAML in .*broken.yaml line"):
        catalog.model_from_yaml(bad)


def test_user_model_file(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nsource: my own design\nnum_layers: 8\nhidden_size: 512\n"
                    "num_heads: 8\nffn_hidden_size: 2048\nvocab_size: 32000\nseq_len: 1024\n")
    model = catalog.get_model(str(path))
    assert (model.name, model.num_kv_heads) == ("mine", 8)


def test_published_batch_needs_its_source(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\nsource: my own design\nnum_layers: 8\nhidden_size: 512\n"
                    "num_heads: 8\nffn_hidden_size: 2048\nvocab_size: 32000\nseq_len: 1024\n"
                    "published_batch_tokens: 65536\n")
    with pytest.raises(CatalogError, match="published_batch_tokens has no"):
        catalog.model_from_yaml(path)
    path.write_text(path.read_text() + "published_batch_tokens_source: our paper\n")
    assert catalog.model_from_yaml(path).published_batch_tokens == 65536


@pytest.mark.parametrize("field, value, shown", [("layers", "abc", "'abc'"),
                                                 ("hidden", 1024.5, "1024.5"),
                                                 ("ffn", True, "True"),
                                                 ("heads", 0, "0")])
def test_an_inline_count_that_is_not_a_positive_integer_is_named(field, value, shown) -> None:
    # A Python caller (or a file read without the CLI's types) may pass text or a
    # fraction: it is named, before the default FFN width is computed from it.
    shape = {"layers": 2, "hidden": 1024, "heads": 16, "kv_heads": None, "ffn": None,
             "vocab": 1000, field: value}
    with pytest.raises(InputError, match=f"invalid --{field} {shown}: must be a positive "
                                         "integer"):
        catalog.resolve_model(None, None, shape["layers"], shape["hidden"], shape["heads"],
                              shape["kv_heads"], shape["ffn"], shape["vocab"], False, None)


def test_gpt_j_and_falcon_count_their_published_shapes() -> None:
    """The serving models of FasterTransformer's and TensorRT-LLM's era. Falcon-7B
    summed from its FalconForCausalLM module print (word embeddings 65024 x 4544
    tied to the head; per layer query_key_value 4544 x 4672, dense 4544 x 4544,
    MLP 4544 x 18176 and back, one LayerNorm; final LayerNorm), to within the
    second norm a layer the model counts; Falcon-40B the same sum with its two
    norms a layer, and Falcon-180B (litgpt's transcription of its config: 80 layers
    of 14848, 232 heads of 64, 8 KV groups); GPT-J within 0.1% of its model card's
    6,053,381,344."""
    from autoconfig.core.catalog import get_model
    from autoconfig.core.model import total_params
    falcon7 = 65024 * 4544 + 32 * (4544 * 4672 + 4544 * 4544 + 2 * 4544 * 18176
                                   + 2 * 4544) + 2 * 4544
    assert total_params(get_model("falcon", "7b")) == falcon7 + 32 * 2 * 4544
    falcon40 = 65024 * 8192 + 60 * (8192 * (8192 + 2 * 8 * 64) + 8192 * 8192
                                    + 2 * 8192 * 32768 + 4 * 8192) + 2 * 8192
    assert total_params(get_model("falcon", "40b")) == falcon40
    falcon180 = 65024 * 14848 + 80 * (14848 * (14848 + 2 * 8 * 64) + 14848 * 14848
                                      + 2 * 14848 * 59392 + 4 * 14848) + 2 * 14848
    assert total_params(get_model("falcon", "180b")) == falcon180
    gpt89 = 51200 * 12288 + 2048 * 12288 + 48 * (12 * 12288 ** 2 + 13 * 12288) + 2 * 12288
    assert total_params(get_model("gpt3", "89b")) == gpt89    # GPT-3 175B at half depth
    assert abs(total_params(get_model("gpt-j", "6b")) / 6_053_381_344 - 1) < 1e-3
    assert get_model("falcon-7b").num_kv_heads == 1     # multi-query
