"""What a software stack can run: the search proposes only that, ``estimate``
refuses the rest, FSDP stacks shard their states, and launch files are written
only for the framework they start (megatron-core)."""

import json

import numpy as np
import pytest

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.plan import Plan, PlanTable, Workload
from autoconfig.errors import CatalogError, InputError
from autoconfig.training import memory
from autoconfig.training.search import search
from autoconfig.training.space import AxisChoices
from autoconfig.training.stack import _load_stack_cached, load_stack, with_overrides
from cli_runner import run_cli

H100 = get_gpu("h100-80gb")
LLAMA8 = get_model("llama3", "8b")


def _search(stack, model=LLAMA8, nodes=2, choices=AxisChoices()):
    return search(model, Workload(256, 8192), Cluster(H100, nodes, 8), choices,
                  software=load_stack(stack).features, stack=stack)


def test_fsdp_stacks_search_pure_data_parallel_plans():
    for stack in ("llm-foundry", "pytorch-fsdp"):
        plans = _search(stack).plans
        assert len(plans) > 0
        assert set(plans.tp) == set(plans.pp) == set(plans.vp) == set(plans.cp) == {1}
        assert not plans.sp.any() and plans.distributed_optimizer.all()
        full = plans.recompute == 2
        assert set(plans.recompute) <= {0, 2}               # none or full, never selective
        assert (plans.recompute_method[full] == 0).all()     # uniform ...
        assert (plans.recompute_num_layers[full] <= 1).all()  # ... of every layer


def test_megatron_deepspeed_has_no_interleaving_sp_cp_selective_or_block():
    gpt3 = get_model("gpt3", "175b")
    result = search(gpt3, Workload(1536, 2048), Cluster(get_gpu("a100-80gb"), 48, 8),
                    software=load_stack("megatron-deepspeed").features, stack="megatron-deepspeed")
    p = result.plans
    assert set(p.vp) == set(p.cp) == {1} and not p.sp.any()
    assert 1 not in set(p.recompute)                         # no selective
    assert not ((p.recompute == 2) & (p.recompute_method == 1)).any()   # no block
    assert (p.tp > 1).any() and (p.pp > 1).any()
    # the same search under megatron-lm does propose what this stack lacks
    free = search(gpt3, Workload(1536, 2048), Cluster(get_gpu("a100-80gb"), 48, 8)).plans
    assert (free.vp > 1).any() and free.sp.any()


def test_asking_a_stack_for_what_it_lacks_is_a_one_line_error(capsys):
    with pytest.raises(InputError, match="stack llm-foundry cannot run tp 8"):
        _search("llm-foundry", choices=AxisChoices(tp=(8,)))
    with pytest.raises(InputError, match="always shards the optimizer"):
        _search("pytorch-fsdp", choices=AxisChoices(distributed_optimizer="off"))
    code, out, err = run_cli(["estimate", "--model", "gpt3-175b", "--gpu", "a100-80gb",
                              "--nodes", "48", "--gbs", "1536", "--tp", "8", "--pp", "8",
                              "--vp", "2", "--stack", "megatron-deepspeed"], capsys)
    assert code != 0 and out == ""
    assert err.strip().count("\n") == 0
    assert "megatron-deepspeed cannot run vp 2" in err and "--vp 1" in err


def test_an_unknown_plan_feature_in_a_stack_file_is_a_catalog_error(tmp_path, monkeypatch):
    path = tmp_path / "odd.yaml"
    path.write_text('features:\n  cannot_run: {value: [warp], source: "test"}\n')
    with pytest.raises(CatalogError, match="unknown plan feature"):
        _load_stack_cached(str(path))


def test_full_shard_keeps_one_shard_of_every_state_and_two_units_gathered():
    plans = PlanTable.from_plans([Plan(tp=1, pp=1, dp=dp, mbs=1, distributed_optimizer=True)
                                  for dp in (8, 64)])
    w = Workload(512, 8192)
    fsdp = load_stack("pytorch-fsdp").features
    full = memory.stage_breakdown(LLAMA8, w, plans, "last", software=fsdp)
    grad_op = memory.stage_breakdown(LLAMA8, w, plans, "last",
                                     software=with_overrides(fsdp, fsdp_sharding="shard-grad-op"))
    ddp = memory.stage_breakdown(LLAMA8, w, plans, "last", software=load_stack("megatron-lm").features)
    # states shrink with the shard count; FULL_SHARD holds far fewer bf16 weights
    states = full.weights_bytes + full.gradients_bytes + full.optimizer_bytes
    assert states[1] < states[0] < (ddp.weights_bytes + ddp.gradients_bytes
                                    + ddp.optimizer_bytes)[0]
    assert np.all(full.weights_bytes < ddp.weights_bytes / 4)
    assert np.allclose(grad_op.weights_bytes, ddp.weights_bytes)   # kept from forward to backward
    assert np.allclose(full.optimizer_bytes * np.array([8, 64]), full.optimizer_bytes[0] * 8)


def test_launch_files_only_for_the_framework_they_start(tmp_path, capsys):
    out = tmp_path / "fsdp"
    code, text, err = run_cli(["search", "--model", "llama3", "--size", "8b", "--gpu", "h100",
                               "--nodes", "2", "--stack", "llm-foundry", "--no-plots",
                               "-o", str(out)], capsys)
    assert code == 0, err
    assert {p.name for p in out.iterdir()} == {"plans.csv", "report.md", "best.yaml",
                                               "best.json"}
    assert "no launch files: the plan was predicted for stack llm-foundry" in text
    best = json.loads((out / "best.json").read_text())
    assert "not_written" in best["launch"] and "megatron_args" not in best["launch"]
    assert "no launch files" in (out / "report.md").read_text()


def test_profiling_refuses_a_stack_it_would_not_run(tmp_path, capsys):
    """Profiling jobs run megatron-core: measuring them says nothing of an FSDP plan."""
    code, out, err = run_cli(["search", "--model", "llama3", "--size", "8b", "--gpu", "h100",
                              "--nodes", "2", "--stack", "pytorch-fsdp", "--profile",
                              "--device", "cpu", "--no-plots", "-o", str(tmp_path / "o")], capsys)
    assert code != 0 and "stack pytorch-fsdp runs pytorch-fsdp" in err
    assert err.strip().count("\n") == 0 and not (tmp_path / "o").exists()


def _recompute_s(stack, model, early_stop, recompute="full", mbs=4):
    from autoconfig.training.step_time import step_time
    features = with_overrides(load_stack(stack).features, recompute_early_stop=early_stop)
    plan = Plan(tp=1, pp=1, dp=8, mbs=mbs, recompute=recompute, distributed_optimizer=True)
    out = step_time(model, Workload(64, 2048), PlanTable.from_plans([plan]), Cluster(H100, 1, 8),
                    software=features)
    return float(out.recompute_s[0]), float(out.step_time_s[0])


def test_an_early_stopping_recompute_skips_each_layers_down_projection():
    """PyTorch's non-reentrant checkpoint stops once the down projection's input,
    the last tensor a dense layer saves, is rebuilt: the recompute is shorter by
    exactly that GEMM's forward in every layer of every micro-batch."""
    from autoconfig.training.step_time import _gemm_timer, load_constants
    model = get_model("gpt3", "1.3b")
    assert load_stack("llm-foundry").features.recompute_early_stop
    assert load_stack("pytorch-fsdp").features.recompute_early_stop
    assert not load_stack("megatron-lm").features.recompute_early_stop
    full, _ = _recompute_s("llm-foundry", model, False)
    early, _ = _recompute_s("llm-foundry", model, True)
    tokens = 4 * 2048
    h, f = model.hidden_size, model.ffn_hidden_size
    down = _gemm_timer(H100, load_constants())(2.0 * f * h * tokens, tokens, h, f)
    micro = 64 // (8 * 4)
    assert full - early == pytest.approx(micro * model.num_layers * down, rel=1e-9)
    # The down projection is a third of a 4h GELU layer's weight FLOPs, less of its time.
    assert 0.15 < (full - early) / full < 1.0 / 3.0


def test_an_early_stopping_recompute_changes_nothing_without_recompute_or_on_moe_layers():
    model = get_model("gpt3", "1.3b")
    assert _recompute_s("llm-foundry", model, True, "none") == \
        _recompute_s("llm-foundry", model, False, "none")
    moe = get_model("qwen3-30b-a3b")
    assert _recompute_s("pytorch-fsdp", moe, True, mbs=1) == \
        _recompute_s("pytorch-fsdp", moe, False, mbs=1)


def test_the_early_stop_override_reaches_estimate(capsys):
    base = ["estimate", "--model", "gpt3", "--size", "1.3b", "--gpu", "h100-80gb", "--gpus", "8",
            "--mbs", "4", "--gbs", "64", "--recompute", "full", "--stack", "llm-foundry",
            "--format", "json"]
    times = {}
    for flag in ("--recompute-early-stop", "--no-recompute-early-stop"):
        code, out, _ = run_cli([*base, flag], capsys)
        assert code == 0
        times[flag] = json.loads(out)["time_breakdown_s"]["recompute"]
    assert times["--recompute-early-stop"] < times["--no-recompute-early-stop"]
