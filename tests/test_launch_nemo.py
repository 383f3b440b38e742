"""NeMo 1 overrides and the Megatron-Bridge (NeMo 2) recipe file.

NeMo 1: the overrides are composed the way Hydra does against NeMo's
megatron_gpt_config.yaml, recorded in tests/data with its commit: a plain key
must exist in the yaml, a ``+`` key must not (Hydra fails otherwise), and the
composed config must carry the plan, shape and schedule.

Megatron-Bridge: its package needs Transformer Engine at import time
(megatron/bridge/peft/lora_layers.py), which has no CPU build, so the recipe
file is checked statically: every ``cfg.section.field = value`` against the
fields recorded from the Megatron-Bridge and Megatron-LM sources
(tests/data/megatron_bridge_fields.json), the recipe function and the
mixed-precision recipe against what Megatron-Bridge exports; then the file's
``autoconfig_config()`` runs on stand-in objects and the values are compared
with the plan and base config.
"""

import ast
import math
import sys
import types

import pytest
import yaml

from autoconfig.launch import bridge, nemo1
from autoconfig.launch.bridge import bridge_text
from autoconfig.launch.files import launch_document, launch_texts
from autoconfig.launch.nemo1 import nemo1_overrides, nemo1_text
from autoconfig.launch.spec import MEGATRON_FUSED_LOSSES, _launch_data
from launch_cases import ALL_CASES, DATA, MOE_CASES, case_spec, recorded

MISSING = object()
NEMO_CASES = sorted(n for n in ALL_CASES if nemo1.not_written_reason(case_spec(n)) is None)
BRIDGE_CASES = sorted(n for n in ALL_CASES if bridge.not_written_reason(case_spec(n)) is None)


def nemo_base() -> dict:
    return yaml.safe_load((DATA / "nemo1_megatron_gpt_config.yaml").read_text())


def nemo_validated_fusion(model: dict, dp: int) -> bool:
    """gradient_accumulation_fusion after NeMo's start-up check, transcribed from NeMo
    8cfedd7 megatron_base_model.py ``_validate_config``: off when DP > 1 and PP 1
    without distributed_fused_adam or mcore_distributed_optim, with FSDP, or without
    megatron_amp_O2."""
    fused = bool(model.get("gradient_accumulation_fusion", False))
    distributed = model["optim"]["name"] in ("distributed_fused_adam", "mcore_distributed_optim")
    if dp > 1 and model.get("pipeline_model_parallel_size", 1) == 1 and not distributed:
        fused = False
    if model.get("fsdp", False) or not model.get("megatron_amp_O2", False):
        fused = False
    return fused


def _get(cfg: dict, dotted: str):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return MISSING
        node = node[part]
    return node


def _set(cfg: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    node = cfg
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def compose(base: dict, overrides: list[str]) -> dict:
    """Hydra's rules for ``key=v`` (key must exist), ``+key=v`` (must not), ``++key=v``."""
    cfg = yaml.safe_load(yaml.safe_dump(base))
    for line in overrides:
        key, _, text = line.partition("=")
        prefix = "++" if key.startswith("++") else "+" if key.startswith("+") else ""
        key = key[len(prefix):]
        exists = _get(cfg, key) is not MISSING
        if prefix == "" and not exists:
            raise KeyError(f"Could not override '{key}': not in the base config (needs '+')")
        if prefix == "+" and exists:
            raise KeyError(f"Could not append to config. An item is already at '{key}'")
        _set(cfg, key, hydra_value(text))
    return cfg


def hydra_value(text: str):
    """A Hydra override value: null/true/false, int, float (``6e-05`` too, unlike
    YAML 1.1), ``[a,b]`` lists, interpolations and other text as strings."""
    if text.startswith("[") and text.endswith("]"):
        return [hydra_value(item) for item in text[1:-1].split(",")] if text != "[]" else []
    lowered = text.lower()
    if lowered in ("null", "true", "false"):
        return {"null": None, "true": True, "false": False}[lowered]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def test_recorded_nemo_yaml_is_sourced():
    first = (DATA / "nemo1_megatron_gpt_config.yaml").read_text().splitlines()[0]
    assert "NVIDIA/NeMo/blob/8cfedd7203462cb251a914e700e5605444277561" in first
    with pytest.raises(KeyError):
        compose(nemo_base(), ["model.context_parallel_size=2"])


@pytest.mark.parametrize("name", NEMO_CASES)
def test_nemo1_overrides_compose_and_match(name):
    spec = case_spec(name)
    cfg = compose(nemo_base(), nemo1_overrides(spec))
    model, m, p, w, b = cfg["model"], spec.model, spec.plan, spec.workload, spec.base
    assert cfg["trainer"]["num_nodes"] == spec.cluster.nodes
    assert cfg["trainer"]["devices"] == spec.cluster.gpus_per_node
    assert (model["num_layers"], model["hidden_size"], model["ffn_hidden_size"],
            model["num_attention_heads"]) == (m.num_layers, m.hidden_size, m.ffn_hidden_size,
                                              m.num_heads)
    assert model["num_query_groups"] == (m.num_kv_heads if m.num_kv_heads != m.num_heads
                                         else None)
    assert model["activation"] == ("swiglu" if m.mlp_kind == "swiglu" else "gelu")
    assert model["normalization"] == m.norm_kind and model["bias"] == m.has_bias
    offloaded = spec.software.cpu_offload_layers
    assert model["cpu_offloading"] == bool(offloaded)
    if offloaded:   # the yaml's default offloads weights too; the prediction did not
        assert model["cpu_offloading_num_layers"] == offloaded
        assert (model["cpu_offloading_activations"], model["cpu_offloading_weights"]) == \
            (True, False)
    assert model["share_embeddings_and_output_weights"] == m.tied_embeddings
    assert model["encoder_seq_length"] == w.seq_len
    if m.position_embedding == "rope":
        assert model["position_embedding_type"] == "rope"
        assert model["rotary_base"] == spec.family.rotary_base
    assert model["hidden_dropout"] == m.hidden_dropout
    assert model["init_method_std"] == pytest.approx(b.init_method_std, rel=1e-5)
    multiple = model["make_vocab_size_divisible_by"] * p.tp
    assert math.ceil(spec.family.tokenizer_vocab_size / multiple) * multiple == m.vocab_size
    assert (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"],
            model["context_parallel_size"], model["sequence_parallel"],
            model["micro_batch_size"], model["global_batch_size"]) == \
        (p.tp, p.pp, p.cp, p.sp, p.mbs, w.global_batch_size)
    assert (model["virtual_pipeline_model_parallel_size"] or 1) == p.vp
    assert model["activations_checkpoint_granularity"] == (None if p.recompute == "none"
                                                           else p.recompute)
    if spec.embedding_and_loss_split:
        assert model["account_for_embedding_in_pipeline_split"] is True
    elif p.first_stage_layers:
        assert model["num_layers_in_first_pipeline_stage"] == p.first_stage_layers
    # the yaml's own default leaves it off; the prediction assumed the stack's, which
    # NeMo's own start-up check must leave as written unless it forbids it, and then
    # the header says so
    fused = model["gradient_accumulation_fusion"]
    assert nemo_validated_fusion(model, p.dp) == fused
    allowed = nemo_validated_fusion({**model, "gradient_accumulation_fusion": True}, p.dp)
    assert fused == (spec.software.gradient_accumulation_fusion and allowed)
    assert ("runs it unfused" in nemo1_text(spec)) == \
        (spec.software.gradient_accumulation_fusion and not allowed)
    # the fused loss the prediction priced, passed to megatron-core's TransformerConfig
    fused_loss = spec.software.cross_entropy in MEGATRON_FUSED_LOSSES
    assert model.get("cross_entropy_loss_fusion", False) == fused_loss
    if fused_loss:
        assert model["cross_entropy_fusion_impl"] == spec.software.cross_entropy
    if spec.interleaved:   # the yaml's own default is batched, blocking sends
        assert model["overlap_p2p_comm"] == spec.software.overlap_p2p_comm
        assert model["batch_p2p_comm"] == (not spec.software.overlap_p2p_comm)
    # Transformer Engine where fp8 or CP needs it (always, here)
    assert model["transformer_engine"] is True
    assert model["fp8"] == (w.precision == "fp8")
    optim = model["optim"]
    assert optim["name"] == ("distributed_fused_adam" if p.distributed_optimizer
                             else "fused_adam")
    assert optim["lr"] == pytest.approx(b.lr, rel=1e-5)
    assert optim["weight_decay"] == b.weight_decay
    assert optim["betas"] == [b.adam_beta1, b.adam_beta2]
    assert optim["sched"]["name"] == "CosineAnnealing"
    assert optim["sched"]["min_lr"] == pytest.approx(b.min_lr, rel=1e-5)
    assert optim["sched"]["warmup_steps"] == spec.warmup_iters > 0
    assert cfg["trainer"]["max_steps"] == spec.train_iters
    assert optim["sched"]["constant_steps"] == spec.train_iters - spec.decay_iters
    assert cfg["trainer"]["gradient_clip_val"] == b.clip_grad


def test_nemo1_text_lines_are_the_overrides():
    spec = case_spec("llama3-8b-fp8-cp")
    lines = [line for line in nemo1_text(spec).splitlines() if not line.startswith("#")]
    assert lines == nemo1_overrides(spec)
    assert "+model.context_parallel_size=2" in lines


# ------------------------------------------------------------ Megatron-Bridge


def bridge_assignments(text: str) -> list[tuple[str, str]]:
    """(section, field) of every ``cfg.section.field = ...`` in the file."""
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute)
                        and isinstance(target.value.value, ast.Name)
                        and target.value.value.id == "cfg"):
                    out.append((target.value.attr, target.attr))
    return out


@pytest.mark.parametrize("name", BRIDGE_CASES)
def test_bridge_recipe_fields_exist(name):
    spec = case_spec(name)
    text = bridge_text(spec)
    data = recorded("megatron_bridge_fields.json")
    fields = dict(data["sections"])
    if spec.model.attention_kind == "mla":   # the MLA recipes' cfg.model is an MLAModelProvider
        fields["model"] = data["providers"]["MLAModelProvider"]
    unknown = [f"{s}.{f}" for s, f in bridge_assignments(text) if f not in fields.get(s, ())]
    assert not unknown, f"fields Megatron-Bridge does not have: {unknown}"
    module, function = spec.family.bridge_recipe.split(":")
    assert function in data["recipes"][module]
    tree = ast.parse(text)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
             and getattr(n.func, "id", "") == "get_mixed_precision_config"]
    assert calls and calls[0].args[0].value in data["mixed_precision_recipes"]
    overlap = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
               and getattr(n.func, "id", "") == "CommOverlapConfig"]
    assert overlap and {k.arg for k in overlap[0].keywords} <= set(fields["comm_overlap"])


class _Section(types.SimpleNamespace):
    pass


def _run_bridge(text: str, monkeypatch) -> types.SimpleNamespace:
    """Run autoconfig_config() with stand-ins for the Megatron-Bridge imports."""
    cfg = types.SimpleNamespace(**{s: _Section() for s in (
        "model", "train", "scheduler", "optimizer", "ddp", "dataset", "tokenizer",
        "checkpoint", "mixed_precision", "comm_overlap")})
    stubs = {}

    def module(name, **attrs):
        mod = types.ModuleType(name)
        mod.__dict__.update(attrs)
        stubs[name] = mod
    recipe_names = {n.names[0].name: n.module for n in ast.walk(ast.parse(text))
                    if isinstance(n, ast.ImportFrom) and n.module
                    and n.module.startswith("megatron.bridge.recipes")}
    for fn, mod in recipe_names.items():
        module(mod, **{fn: lambda: cfg})
    module("megatron.bridge.training.comm_overlap",
           CommOverlapConfig=lambda **kw: _Section(**kw))
    module("megatron.bridge.training.gpt_step", forward_step=None)
    module("megatron.bridge.training.mixed_precision",
           get_mixed_precision_config=lambda name: _Section(name=name))
    module("megatron.bridge.training.pretrain", pretrain=None)
    for name, mod in stubs.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setenv("DATA_PATH", "/data/my_text_document")
    namespace = {"__name__": "bridge_recipe"}
    exec(compile(text, "bridge_recipe.py", "exec"), namespace)   # noqa: S102 - our own output
    return namespace["autoconfig_config"]()


@pytest.mark.parametrize("name", BRIDGE_CASES)
def test_bridge_recipe_values_match(name, monkeypatch):
    pytest.importorskip("megatron.core")
    spec = case_spec(name)
    cfg = _run_bridge(bridge_text(spec), monkeypatch)
    m, p, w, b = spec.model, spec.plan, spec.workload, spec.base
    assert (cfg.model.num_layers, cfg.model.hidden_size, cfg.model.ffn_hidden_size,
            cfg.model.num_attention_heads, cfg.model.num_query_groups) == \
        (m.num_layers, m.hidden_size, m.ffn_hidden_size, m.num_heads, m.num_kv_heads)
    if not spec.family.recipe_builds_model:   # else the recipe's own architecture stays
        assert cfg.model.gated_linear_unit == (m.mlp_kind == "swiglu")
    assert (cfg.model.tensor_model_parallel_size, cfg.model.pipeline_model_parallel_size,
            cfg.model.context_parallel_size, cfg.model.sequence_parallel) == \
        (p.tp, p.pp, p.cp, p.sp)
    assert (cfg.model.virtual_pipeline_model_parallel_size or 1) == p.vp
    if spec.embedding_and_loss_split:
        assert cfg.model.account_for_embedding_in_pipeline_split is True
    else:
        assert (cfg.model.num_layers_in_first_pipeline_stage or 0) == p.first_stage_layers
    assert (cfg.train.global_batch_size, cfg.train.micro_batch_size) == \
        (w.global_batch_size, p.mbs)
    assert cfg.train.train_iters == spec.train_iters
    assert cfg.scheduler.lr_warmup_iters == spec.warmup_iters > 0
    assert cfg.scheduler.lr_decay_style == "cosine"
    assert cfg.optimizer.lr == pytest.approx(b.lr, rel=1e-5)
    assert cfg.optimizer.min_lr == pytest.approx(b.min_lr, rel=1e-5)
    assert (cfg.optimizer.adam_beta2, cfg.optimizer.weight_decay) == (b.adam_beta2,
                                                                      b.weight_decay)
    assert cfg.model.init_method_std == pytest.approx(b.init_method_std, rel=1e-5)
    assert cfg.ddp.overlap_grad_reduce == spec.software.overlap_grad_reduce
    assert cfg.ddp.use_megatron_fsdp == spec.software.megatron_fsdp
    offloaded = spec.software.cpu_offload_layers
    assert getattr(cfg.model, "cpu_offloading", False) == bool(offloaded)
    if offloaded:
        assert cfg.model.cpu_offloading_num_layers == offloaded
        assert cfg.model.cpu_offloading_weights is False
    if spec.software.megatron_fsdp:
        assert cfg.ddp.data_parallel_sharding_strategy == "optim_grads_params"
        assert cfg.checkpoint.ckpt_format == "fsdp_dtensor"
    else:
        assert not hasattr(cfg.ddp, "data_parallel_sharding_strategy")
    assert cfg.model.gradient_accumulation_fusion == spec.software.gradient_accumulation_fusion
    # the loss the prediction priced (the Bridge recipes' te, unfused for megatron-lm)
    assert cfg.model.cross_entropy_loss_fusion == (spec.software.cross_entropy
                                                  in MEGATRON_FUSED_LOSSES)
    if cfg.model.cross_entropy_loss_fusion:
        assert cfg.model.cross_entropy_fusion_impl == spec.software.cross_entropy
    assert cfg.comm_overlap.tp_comm_overlap == spec.tp_comm_overlap
    if spec.interleaved:
        assert cfg.comm_overlap.overlap_p2p_comm == spec.software.overlap_p2p_comm
        assert cfg.comm_overlap.batch_p2p_comm == (not spec.software.overlap_p2p_comm)
    assert ("fp8" in cfg.mixed_precision.name) == (w.precision == "fp8")
    assert ("nvfp4" in cfg.mixed_precision.name) == (w.precision == "nvfp4")
    assert cfg.dataset.blend == (["/data/my_text_document"], None)
    if m.family == "llama3":
        assert cfg.model.rotary_base == 500000


# ------------------------------------------------------------ mixture of experts


@pytest.mark.parametrize("name", [n for n in NEMO_CASES if n in MOE_CASES])
def test_nemo1_moe_keys_compose_and_match(name):
    """NeMo 1 gets the experts, EP, router and dispatcher, and the layer spec that
    builds per-layer kinds and Q/K norms from the config."""
    spec = case_spec(name)
    model = compose(nemo_base(), nemo1_overrides(spec))["model"]
    m, p, moe = spec.model, spec.plan, spec.moe
    assert model["name"] == "decoder_block_gpt"
    assert (model["num_moe_experts"], model["moe_router_topk"], model["moe_ffn_hidden_size"],
            model["expert_model_parallel_size"]) == (m.num_experts, m.moe_topk,
                                                     m.moe_ffn_hidden_size, p.ep)
    assert p.etp == p.tp and "expert_tensor_parallel_size" not in model
    pattern = [1 if kind == "moe" else 0 for kind in m.layer_pattern]
    assert model["moe_layer_freq"] in (1, pattern) and (model["moe_layer_freq"] == 1) == \
        all(pattern)
    assert model["moe_grouped_gemm"] == moe.grouped_gemm
    assert model["moe_token_dispatcher_type"] == moe.dispatcher
    assert model["moe_router_load_balancing_type"] == moe.router.load_balancing_type
    assert model["moe_aux_loss_coeff"] == pytest.approx(moe.router.aux_loss_coeff)
    assert model.get("qk_layernorm", False) == m.qk_norm
    assert model["kv_channels"] == (m.kv_channels or None)


@pytest.mark.parametrize("name, reason", [("deepseek-v3-ep64-pp8-hybridep", "multi-latent"),
                                          ("mixtral-8x7b-etp2", "expert tensor parallelism"),
                                          ("llama3-70b-fp8-megatron-fsdp", "Megatron-FSDP")])
def test_nemo1_refuses_what_it_cannot_run(name, reason):
    """No nemo_overrides.txt for MLA or ETP != TP: the reason goes where the files are
    listed (best.yaml's launch section), as for a stack that launches nothing."""
    spec = case_spec(name)
    why = nemo1.not_written_reason(spec)
    assert why and reason in why
    assert "nemo" not in launch_texts(spec) and "megatron" in launch_texts(spec)
    document = launch_document(spec)
    assert document["nemo1_not_written"] == why and "nemo1_overrides" not in document


def test_bridge_refuses_mla_without_its_own_recipe():
    """An MLA model needs an MLA provider, which only its own recipe builds."""
    import dataclasses
    spec = case_spec("deepseek-v3-ep64-pp8-hybridep")
    other = dataclasses.replace(spec, family=dataclasses.replace(
        spec.family, recipe_builds_model=False,
        bridge_recipe="megatron.bridge.recipes.gpt:vanilla_gpt_pretrain_config"))
    assert bridge.not_written_reason(spec) is None
    assert "multi-latent" in bridge.not_written_reason(other)
    assert "bridge" not in launch_texts(other) and "bridge_not_written" in launch_document(other)


def test_launch_yaml_recipes_are_real():
    """Every recipe heuristics/launch.yaml names is exported by Megatron-Bridge at the
    recorded commit (families, per-model, MoE models' own, fallback)."""
    data, exported = _launch_data(), recorded("megatron_bridge_fields.json")["recipes"]
    names = [entry["bridge_recipe"]["value"] for entry in data["families"].values()]
    names += [entry["value"] for key in ("recipes_by_model", "moe_recipes")
              for entry in data[key].values()]
    names.append(data["fallback_bridge_recipe"]["value"])
    for name in names:
        module, function = name.split(":")
        assert function in exported.get(module, ()), name
    assert {"deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b",
            "kimi-k2"} <= set(data["moe_recipes"])


@pytest.mark.parametrize("name", [n for n in BRIDGE_CASES if n in MOE_CASES])
def test_bridge_moe_values_match(name, monkeypatch):
    """The MoE fields and plan on Bridge's model config, the A2A overlap on its
    CommOverlapConfig; a model's own recipe keeps its architecture and router, and
    its pipeline layout is replaced by the plan's split."""
    pytest.importorskip("megatron.core")
    spec = case_spec(name)
    cfg = _run_bridge(bridge_text(spec), monkeypatch)
    m, p, moe, model = spec.model, spec.plan, spec.moe, cfg.model
    assert (model.num_moe_experts, model.moe_router_topk, model.moe_ffn_hidden_size) == \
        (m.num_experts, m.moe_topk, m.moe_ffn_hidden_size)
    assert model.moe_shared_expert_intermediate_size == (m.moe_shared_expert_ffn_hidden_size
                                                         or None)
    pattern = [1 if kind == "moe" else 0 for kind in m.layer_pattern]
    assert model.moe_layer_freq == (1 if all(pattern) else pattern)
    assert (model.expert_model_parallel_size, model.expert_tensor_parallel_size) == (p.ep, p.etp)
    assert model.moe_token_dispatcher_type == moe.dispatcher
    assert model.moe_flex_dispatcher_backend == moe.flex_backend
    assert model.moe_grouped_gemm == spec.software.moe_grouped_gemm
    assert model.moe_shared_expert_overlap is False
    assert cfg.comm_overlap.overlap_moe_expert_parallel_comm == moe.a2a_overlap
    assert model.mtp_num_layers == (m.mtp_layers or None)
    own = spec.family.recipe_builds_model
    assert own == (m.name in _launch_data()["moe_recipes"])
    if spec.plan.recompute == "selective":   # the plan's recompute modules, not the recipe's
        assert model.recompute_modules == (spec.plan.recompute_modules or "core_attn").split(",")
    if own:
        # the recipe's own layout is replaced by the plan's (a layout only where
        # the plan's split needs one)
        assert model.pipeline_model_parallel_layout == spec.pipeline_layout
        assert not hasattr(model, "activation_func") and not hasattr(
            model, "moe_router_load_balancing_type")
    else:
        assert model.moe_router_load_balancing_type == moe.router.load_balancing_type
        assert model.moe_aux_loss_coeff == moe.router.aux_loss_coeff
    if m.attention_kind == "mla":
        assert model.multi_latent_attention and model.qk_layernorm
        assert (model.q_lora_rank, model.kv_lora_rank, model.qk_head_dim,
                model.qk_pos_emb_head_dim, model.v_head_dim) == \
            (m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim)


def test_nemo1_cross_entropy_keys_are_megatron_core_config_fields():
    """NeMo 1's build_transformer_config passes the model section's TransformerConfig
    fields through: the fused-loss keys the overrides add must be such fields."""
    core = pytest.importorskip("megatron.core.transformer.transformer_config")
    import dataclasses as dc
    from autoconfig.launch.nemo1 import CROSS_ENTROPY_KEYS
    fields = {f.name for f in dc.fields(core.TransformerConfig)}
    assert {key.split(".", 1)[1] for key in CROSS_ENTROPY_KEYS} <= fields
    spec = case_spec("llama3-8b-fp8-cp")   # the nemo stack: Transformer Engine's loss
    assert spec.software.cross_entropy == "te"
    lines = nemo1_overrides(spec)
    assert "+model.cross_entropy_loss_fusion=true" in lines
    assert "+model.cross_entropy_fusion_impl=te" in lines


def test_nvfp4_is_written_for_megatron_and_bridge_not_nemo1():
    """NVFP4 runs get Megatron-LM arguments and a Bridge recipe (bf16_with_nvfp4_mixed);
    NeMo 1 overrides are not written, and the document says why in one line."""
    spec = case_spec("llama3-70b-nvfp4-gb300-vp")
    texts = launch_texts(spec)
    assert "nemo" not in texts and {"megatron", "bridge"} <= set(texts)
    why = launch_document(spec)["nemo1_not_written"]
    assert "NVFP4" in why and "\n" not in why
    assert "'bf16_with_nvfp4_mixed'" in texts["bridge"][1]
    assert "--fp4-format e2m1" in texts["megatron"][1]
