"""Every launch target of one LaunchSpec, as file texts and as one document."""

from autoconfig.launch import bridge, megatron_lm, nemo1, sbatch
from autoconfig.launch.spec import LaunchSpec

MEGATRON_NAME = "megatron_args.sh"
SBATCH_NAME = "launch.sbatch"
BRIDGE_NAME = "bridge_recipe.py"
BRIDGE_SBATCH_NAME = "launch_bridge.sbatch"
NEMO_NAME = "nemo_overrides.txt"


def launch_texts(spec: LaunchSpec) -> dict[str, tuple[str, str]]:
    """key -> (file name, text) for every target (none for a stack they do not run)."""
    if not spec.launchable:
        return {}
    return {
        "megatron": (MEGATRON_NAME, megatron_lm.megatron_args_script(spec)),
        "sbatch": (SBATCH_NAME, sbatch.render_sbatch(spec)),
        "bridge": (BRIDGE_NAME, bridge.bridge_text(spec)),
        "bridge_sbatch": (BRIDGE_SBATCH_NAME,
                          sbatch.render_sbatch(spec, ["python", BRIDGE_NAME], [])),
        "nemo": (NEMO_NAME, nemo1.nemo1_text(spec)),
    }


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
                  "attention_backend": spec.attention_backend},
    }
    if not spec.launchable:
        return {**document, "not_written": spec.not_launchable_reason}
    return {
        **document,
        "tokenizer": {"type": spec.family.tokenizer_type, "model": spec.family.tokenizer_model,
                      "vocab_size": spec.family.tokenizer_vocab_size,
                      "make_vocab_size_divisible_by": spec.vocab_divisor,
                      "padded_vocab_size": spec.padded_vocab},
        "megatron_args": megatron_lm.megatron_args(spec, "real"),
        "megatron_mock_args": megatron_lm.megatron_args(spec, "mock"),
        "nemo1_overrides": nemo1.nemo1_overrides(spec),
        "bridge": {"recipe": spec.family.bridge_recipe,
                   "fields": {k: (str(v) if type(v).__name__ == "_Name" else v)
                              for k, v in bridge.assignments(spec)}},
        "files": {key: name for key, (name, _) in launch_texts(spec).items()},
    }
