"""Every launch target of one LaunchSpec, as file texts and as one document."""

import dataclasses

from autoconfig.launch import bridge, megatron_lm, nemo1, sbatch
from autoconfig.launch.spec import LaunchSpec

MEGATRON_NAME = "megatron_args.sh"
SBATCH_NAME = "launch.sbatch"
BRIDGE_NAME = "bridge_recipe.py"
BRIDGE_SBATCH_NAME = "launch_bridge.sbatch"
NEMO_NAME = "nemo_overrides.txt"


def not_written(spec: LaunchSpec) -> dict[str, str]:
    """Target -> why it gets no file for this model or plan (a file that cannot
    run is never written); empty when every target runs it."""
    reasons = {"megatron": megatron_lm.not_written_reason(spec),
               "bridge": bridge.not_written_reason(spec), "nemo": nemo1.not_written_reason(spec)}
    return {key: reason for key, reason in reasons.items() if reason}


def launch_texts(spec: LaunchSpec) -> dict[str, tuple[str, str]]:
    """key -> (file name, text) for every target (none for a stack they do not run,
    none for a target that cannot run the model: ``not_written``)."""
    if not spec.launchable:
        return {}
    skip = not_written(spec)
    texts = {}
    if "megatron" not in skip:   # launch.sbatch runs the same arguments
        texts["megatron"] = (MEGATRON_NAME, megatron_lm.megatron_args_script(spec))
        texts["sbatch"] = (SBATCH_NAME, sbatch.render_sbatch(spec))
    if "bridge" not in skip:
        texts["bridge"] = (BRIDGE_NAME, bridge.bridge_text(spec))
        texts["bridge_sbatch"] = (BRIDGE_SBATCH_NAME,
                                  sbatch.render_sbatch(spec, ["python", BRIDGE_NAME], []))
    if "nemo" not in skip:
        texts["nemo"] = (NEMO_NAME, nemo1.nemo1_text(spec))
    return texts


def launch_document(spec: LaunchSpec) -> dict:
    """The launch part of best.yaml / best.json: hyper-parameters with their origin,
    the derived schedule and every target's arguments."""
    b = spec.base
    document = {
        "hyperparameters": {
            "source": spec.base_source,
            "tokens": float(b.tokens), "lr": b.lr, "min_lr": b.min_lr,
            "lr_decay_style": b.lr_decay_style, "lr_warmup_steps": b.lr_warmup_steps,
            "lr_decay_steps": b.lr_decay_steps, "train_steps": b.train_steps,
            "base_global_batch_size": b.global_batch_size,
            "weight_decay": b.weight_decay, "adam_beta1": b.adam_beta1,
            "adam_beta2": b.adam_beta2, "adam_eps": b.adam_eps, "clip_grad": b.clip_grad,
            "init_method_std": b.init_method_std,
            "hidden_dropout": spec.model.hidden_dropout,
            "attention_dropout": spec.model.attention_dropout},
        "schedule": {"train_samples": spec.train_samples, "warmup_samples": spec.warmup_samples,
                     "decay_samples": spec.decay_samples, "train_iters": spec.train_iters,
                     "warmup_iters": spec.warmup_iters, "decay_iters": spec.decay_iters},
        "stack": {"name": spec.stack, "tp_comm_overlap": spec.tp_comm_overlap,
                  "overlap_grad_reduce": spec.software.overlap_grad_reduce,
                  "overlap_param_gather": spec.overlap_param_gather,
                  "grad_reduce_dtype": spec.grad_reduce_dtype,
                  "overlap_p2p_comm": spec.overlap_p2p_comm,
                  "attention_backend": spec.attention_backend,
                  "cross_entropy": spec.software.cross_entropy},
    }
    if not spec.launchable:
        return {**document, "not_written": spec.not_launchable_reason}
    skip = not_written(spec)
    if spec.moe is not None:
        document["stack"].update(moe_document(spec))
    document["tokenizer"] = {
        "type": spec.family.tokenizer_type, "model": spec.family.tokenizer_model,
        "vocab_size": spec.family.tokenizer_vocab_size,
        "make_vocab_size_divisible_by": spec.vocab_divisor, "padded_vocab_size": spec.padded_vocab}
    document.update(megatron_document(spec, skip))
    if "nemo" in skip:
        document["nemo1_not_written"] = skip["nemo"]
    else:
        document["nemo1_overrides"] = nemo1.nemo1_overrides(spec)
    if "bridge" in skip:
        document["bridge_not_written"] = skip["bridge"]
    else:
        document["bridge"] = {"recipe": spec.family.bridge_recipe,
                              "fields": {k: (str(v) if type(v).__name__ == "_Name" else v)
                                         for k, v in bridge.assignments(spec)}}
    document["files"] = {key: name for key, (name, _) in launch_texts(spec).items()}
    return document


def megatron_document(spec: LaunchSpec, skip: dict[str, str]) -> dict:
    """Megatron-LM's arguments, real and synthetic data, or why there are none."""
    if "megatron" in skip:
        return {"megatron_not_written": skip["megatron"]}
    real = megatron_lm.megatron_args(spec, "real")
    if spec.model.is_encoder_decoder:
        return {"megatron_script": megatron_lm.pretrain_script(spec), "megatron_args": real,
                "megatron_mock_not_written": "pretrain_t5.py has no synthetic T5 data"}
    return {"megatron_args": real, "megatron_mock_args": megatron_lm.megatron_args(spec, "mock")}


def moe_document(spec: LaunchSpec) -> dict:
    """The MoE part of the stack section: how the experts run and are routed."""
    moe = spec.moe
    router = dataclasses.asdict(moe.router)
    return {"moe_dispatcher": moe.dispatcher, "moe_flex_backend": moe.flex_backend,
            "moe_a2a_overlap": moe.a2a_overlap, "moe_a2a_overlap_off": moe.a2a_overlap_off,
            "moe_grouped_gemm": moe.grouped_gemm,
            "moe_router": router}
