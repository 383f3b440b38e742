"""What one layer of the profiling worker's model keeps for its backward, measured.

Builds the worker's megatron-core GPT model (its config and layer spec: local
layers, no Transformer Engine) in bf16 on CPU with one and with two layers, runs
one forward under ``torch.autograd.graph.saved_tensors_hooks`` and counts the
distinct storages autograd keeps; the two-layer count less the one-layer count
is one layer's. Parameters (leaves) are left out: they are weights, not
activations. Split into the attention probabilities (tensors whose last two
dimensions are the sequence: their bytes depend on how softmax runs) and the
rest, which ``training.activations.layer_stored_widths`` predicts.

    python -m autoconfig.profiling.saved_activations --model gpt3 --size 126m --seq-len 512

prints one JSON line: {"scores_bytes": .., "other_bytes": .., "predicted_other_bytes": ..}
per layer and micro-batch sample. Slow for wide models (a 2048-wide MoE layer at
2048 tokens: ~5 min on 2 cores).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import socket
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _saved_storages(model, seq_len: int, num_layers: int) -> dict[int, tuple[int, bool]]:
    """data_ptr -> (bytes, holds attention probabilities) of what one forward keeps."""
    import torch
    from megatron.core.models.gpt.gpt_model import GPTModel

    from autoconfig.core.plan import Plan, Workload
    from autoconfig.profiling import worker
    from autoconfig.profiling.spec import ProfileSpec

    m = dataclasses.replace(model, num_layers=num_layers, moe_first_dense_layers=0)
    spec = ProfileSpec(model=m, workload=Workload(global_batch_size=1, seq_len=seq_len),
                       plan=Plan(tp=1, pp=1, dp=1), device="cpu", warmup_steps=0, timed_steps=1)
    config = worker._transformer_config(spec)
    config.bf16, config.params_dtype = True, torch.bfloat16   # the GPU's dtypes
    if m.is_moe:
        worker._define_missing_te_gemm()
    net = GPTModel(config=config, transformer_layer_spec=worker._block_spec(spec, config, None),
                   vocab_size=worker._padded_vocab(spec), max_sequence_length=seq_len,
                   share_embeddings_and_output_weights=m.tied_embeddings,
                   position_embedding_type="rope" if m.position_embedding == "rope"
                   else "learned_absolute").bfloat16()
    batch = worker._microbatches_of_this_rank(spec)[0]
    kept: dict[int, tuple[int, bool]] = {}

    def pack(tensor):
        if tensor.grad_fn is not None and tensor.numel():   # activations, not weights
            storage = tensor.untyped_storage()
            scores = tensor.dim() >= 2 and tensor.shape[-1] == tensor.shape[-2] == seq_len
            kept[storage.data_ptr()] = (storage.nbytes(), scores)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        net(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return kept


def layer_saved_bytes(model, seq_len: int) -> dict[str, float]:
    """One layer's kept bytes per sample: attention probabilities, the rest, and
    the rest as ``layer_stored_widths`` predicts it (the model's last layer kind)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from autoconfig.profiling.cpu_bridge import cpu_bridge
    from autoconfig.training.activations import layer_stored_widths

    torch.distributed.init_process_group("gloo", rank=0, world_size=1,
                                         init_method=f"tcp://127.0.0.1:{_free_port()}")
    with cpu_bridge():
        parallel_state.initialize_model_parallel(1, 1)
        torch.manual_seed(1)
        model_parallel_cuda_manual_seed(1)
        one, two = (_saved_storages(model, seq_len, layers) for layers in (1, 2))

    def total(kept, scores: bool) -> float:
        return float(sum(b for b, is_scores in kept.values() if is_scores == scores))

    replicated, split = layer_stored_widths(model, kind=model.layer_pattern[-1])
    return {"scores_bytes": total(two, True) - total(one, True),
            "other_bytes": total(two, False) - total(one, False),
            "predicted_other_bytes": float((replicated + split) * seq_len)}


def main(argv: list[str] | None = None) -> int:
    from autoconfig.core.catalog import get_model
    from autoconfig.errors import AutoconfigError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--size")
    parser.add_argument("--seq-len", type=int, default=512)
    args = parser.parse_args(argv)
    try:
        model = get_model(args.model, args.size)
    except AutoconfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # The worker trains without dropout (its losses must agree across layouts).
    model = dataclasses.replace(model, hidden_dropout=0.0, attention_dropout=0.0)
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    print(json.dumps(layer_saved_bytes(model, args.seq_len)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
