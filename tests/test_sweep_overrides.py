"""Sweep files take the stack's single-feature overrides, as the CLI does."""

import json

import pandas as pd
import pytest

from autoconfig.errors import InputError
from autoconfig.sweep.run import run_sweep
from autoconfig.sweep.spec import parse_sweep
from cli_runner import cli

LLAMA70 = {"model": "llama3-70b", "gpu": "h100", "nodes": 8, "precision": "fp8",
           "stack": "nemo"}


def test_overrides_are_an_axis_and_a_setting_without_them_keeps_its_key():
    spec = parse_sweep({"matrix": {**{k: [v] for k, v in LLAMA70.items()},
                                   "overrides": [{}, {"tp_comm_overlap": False},
                                                 {"fp8_recipe": "delayed"}]}})
    keys = [s.key for s in spec.settings]
    assert len(set(keys)) == 3
    assert keys[0] == "llama3-70b|h100-80gb|8n|gbs=auto|seq=auto|fp8|nemo|throughput|predict"
    assert "nemo+tp_comm_overlap=false|" in keys[1]
    assert "nemo+fp8_recipe=delayed|" in keys[2]
    assert spec.settings[1].to_dict()["overrides"] == {"tp_comm_overlap": False}


@pytest.mark.parametrize("overrides, message", [
    ({"tp_comm_overlaps": True}, "unknown override 'tp_comm_overlaps': allowed are"),
    ({"tp_comm_overlap": "yes"}, "invalid tp_comm_overlap 'yes': must be true or false"),
    ({"moe_imbalance": "high"}, "invalid moe_imbalance 'high': must be a number"),
    ({"fp8_recipe": "fp6"}, "invalid --fp8-recipe 'fp6'"),
    ({"cp_comm_type": "ring"}, "invalid --cp-comm-type 'ring': allowed are p2p, a2a, a2a+p2p"),
    ({"fsdp_sharding": "shard-grad-op"},
     "invalid --fsdp-sharding 'shard-grad-op' on a megatron-core stack: allowed are full-shard"),
    ({"cpu_offload_layers": -1}, "invalid --cpu-offload-layers -1: must be a whole number"),
    ({"cpu_offload_layers": 2.5}, "invalid cpu_offload_layers 2.5: must be a whole number"),
    ("tp_comm_overlap", "expected a mapping of override names to values"),
])
def test_bad_overrides_fail_with_one_line_naming_the_value(tmp_path, overrides, message):
    data = {"settings": [{**LLAMA70, "overrides": overrides}]}
    with pytest.raises(InputError) as exc:
        parse_sweep(data)
    assert message in str(exc.value) and "settings[0]: overrides" in str(exc.value)
    assert "\n" not in str(exc.value)


def test_a_sweep_setting_with_overrides_predicts_what_search_does_with_the_options(tmp_path):
    spec = parse_sweep({"matrix": {**{k: [v] for k, v in LLAMA70.items()},
                                   "overrides": [{}, {"tp_comm_overlap": False}]}})
    records = {r["key"]: r for r in run_sweep(spec, tmp_path / "sweep")}
    assert all(r["status"] == "ok" for r in records.values())
    default, off = (records[s.key]["best"]["predicted"]["tokens_per_s_per_gpu"]
                    for s in spec.settings)
    # TP traffic no longer hidden behind the GEMMs: the same model runs slower.
    assert off < default
    proc = cli("search", "--model", "llama3-70b", "--gpu", "h100", "--nodes", "8",
               "--precision", "fp8", "--stack", "nemo", "--no-tp-comm-overlap", "--no-plots",
               "--format", "json", "-o", tmp_path / "search")
    assert proc.returncode == 0, proc.stderr
    best = json.loads(proc.stdout)["best"]
    assert best["predicted"]["tokens_per_s_per_gpu"] == float(f"{off:.4g}")


def test_the_report_names_the_overrides_where_settings_differ_in_them(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(json.dumps({"matrix": {**{k: [v] for k, v in LLAMA70.items()},
                                           "overrides": [{}, {"tp_comm_overlap": False}]}}))
    proc = cli("sweep", path, "-o", tmp_path / "run", "--no-plots")
    assert proc.returncode == 0, proc.stderr
    df = pd.read_csv(tmp_path / "run" / "sweep.csv")
    assert list(df["overrides"].fillna("")) == ["", "--no-tp-comm-overlap"]
    markdown = (tmp_path / "run" / "sweep.md").read_text()
    assert "| nemo --no-tp-comm-overlap " in markdown and "| stack " in markdown


def test_the_shipped_fp8_recipe_sweep_ranks_recipes_on_each_gpu(tmp_path):
    from pathlib import Path
    from autoconfig.sweep.spec import load_sweep
    spec = load_sweep(Path(__file__).resolve().parent.parent / "configs" / "sweeps"
                      / "fp8-recipes.yaml")
    records = run_sweep(spec, tmp_path / "run")
    assert [r["status"] for r in records] == ["ok"] * 7
    recipes = {(r["setting"]["gpu"], r["setting"]["overrides"]["fp8_recipe"]):
               r["best"]["predicted"]["tokens_per_s_per_gpu"] for r in records}
    assert {gpu for gpu, _ in recipes} == {"b200", "h100-80gb"}
    # Current scaling's per-tensor amax passes cost what delayed scaling's history saves.
    assert recipes["h100-80gb", "tensorwise"] < recipes["h100-80gb", "delayed"]


def test_one_override_value_has_one_key():
    keys = [parse_sweep({"settings": [{**LLAMA70, "overrides": overrides}]}).settings[0].key
            for overrides in ({"fp8_recipe": "current"}, {"fp8_recipe": "tensorwise"})]
    assert keys[0] == keys[1] and "+fp8_recipe=tensorwise|" in keys[0]
    keys = [parse_sweep({"settings": [{**LLAMA70, "overrides": {"moe_imbalance": v}}]})
            .settings[0].key for v in (2, 2.0)]
    assert keys[0] == keys[1] and "+moe_imbalance=2|" in keys[0]


def test_a_sweep_setting_shards_and_offloads_as_the_options_do(tmp_path):
    spec = parse_sweep({"settings": [{**LLAMA70, "overrides": {"fsdp_sharding": "full-shard",
                                                                 "cpu_offload_layers": 20}}]})
    setting = spec.settings[0]
    assert "fsdp_sharding=full-shard" in setting.key and "cpu_offload_layers=20" in setting.key
    record = run_sweep(spec, tmp_path / "sweep")[0]
    assert record["status"] == "ok"
    best = record["best"]["plan"]
    # megatron-core offloads only on one stage without recompute
    assert best["pp"] == 1 and best["recompute"] == "none"
