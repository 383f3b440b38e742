"""How many PyTorch operators one decode step of the inference worker dispatches, counted.

The inference worker (``autoconfig.profiling.inference_worker``: megatron-core
0.16.1's static path, local layers, eager, no CUDA graphs) is host-bound at the
batches it runs: each operator costs its Python and dispatch time on the host,
so a decode step takes about (operators x host time per operator), or the GPU's
own time where that is longer (``heuristics/engines/megatron-core-static.yaml``).
The local attention also reads one value back per layer
(``aten._local_scalar_dense``); measured, the step is still the larger of host
and GPU time, not their sum (``benchmarks/gpu/README.md``).

This builds the worker's model on CPU with one and with two layers, runs the
worker's prefill and one decode step through the same megatron-core calls, and
counts the ATen operators the decode step dispatches (``TorchDispatchMode``);
the two-layer count less the one-layer count is one layer's, the rest the
step's own (embedding, output layer, the wrapper's input preparation). View and
metadata operators are counted apart: they launch no kernel but still cost host
time.

    python -m autoconfig.profiling.host_ops --model gpt3 --size 1.3b

prints one JSON line: {"per_layer": .., "per_step": .., "per_layer_views": ..,
"per_step_views": .., "syncs_per_layer": ..}. The counts do not depend on the
width, so the model is built narrow (fast on any CPU).

An MoE model's counts are those of its MoE layers, with two more entries:
"per_local_expert" and "moe_fixed". The worker runs the experts of a layer one
after another (megatron-core's SequentialMLP: every local expert's MLP is called,
whether or not a token reached it), so an MoE layer dispatches a fixed number of
operators (attention, router, dispatcher) plus a number per local expert. Both
are found by counting the same layer with two numbers of experts.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys

VIEW_OPS = frozenset({"view", "_unsafe_view", "t", "transpose", "permute", "expand",
                      "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes",
                      "detach", "alias", "_reshape_alias", "as_strided", "unbind", "reshape",
                      "chunk", "narrow", "lift_fresh"})
"""ATen operators that only make a new view of a tensor: no kernel."""
SYNC_OPS = frozenset({"_local_scalar_dense", "item"})
"""Operators that copy a value to the host: the host waits for the GPU."""
NARROW = {"hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 256, "vocab_size": 512}
"""The width the counting model is built with (operator counts do not depend on it)."""


COUNTED_EXPERTS = (4, 8)
"""Experts of the two MoE layers counted (top-k at most the fewer of them)."""


def _narrow(model, experts: int | None = None):
    """``model`` at the NARROW width, grouped-query attention kept where it has it;
    an MoE model with ``experts`` experts, every layer an MoE layer."""
    heads = NARROW["num_heads"]
    moe = {}
    if model.is_moe:
        experts = experts or COUNTED_EXPERTS[0]
        moe = dict(num_experts=experts, moe_topk=min(model.moe_topk, COUNTED_EXPERTS[0]),
                   moe_ffn_hidden_size=NARROW["ffn_hidden_size"], moe_first_dense_layers=0,
                   moe_shared_expert_ffn_hidden_size=(
                       NARROW["ffn_hidden_size"] if model.moe_shared_expert_ffn_hidden_size
                       else 0))
    return dataclasses.replace(
        model, hidden_size=NARROW["hidden_size"], num_heads=heads,
        num_kv_heads=heads if model.num_kv_heads == model.num_heads else heads // 2,
        ffn_hidden_size=NARROW["ffn_hidden_size"], vocab_size=NARROW["vocab_size"],
        hidden_dropout=0.0, attention_dropout=0.0, **moe)


def _decode_step_ops(model, layers: int, input_len: int, batch: int) -> collections.Counter:
    """ATen operators of the worker's first decode step on a ``layers``-layer model."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from megatron.core import parallel_state

    from autoconfig.inference.plan import InferencePlan, InferenceWorkload
    from autoconfig.profiling.inference_worker import (InferenceProfileSpec, _build_model,
                                                       static_wrapper)

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    spec = InferenceProfileSpec(model=dataclasses.replace(model, num_layers=layers),
                                workload=InferenceWorkload(input_len, 2),
                                plan=InferencePlan(1, 1, batch, 1), device="cpu")
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    net, config, vocab = _build_model(spec)
    wrapper, context = static_wrapper(spec, net, config, vocab)
    tokens = torch.randint(0, model.vocab_size, (batch, spec.workload.total_len_tokens),
                           generator=torch.Generator().manual_seed(1))
    wrapper.prep_model_for_inference()
    inputs = wrapper.prep_inference_input(tokens)
    with torch.inference_mode():
        wrapper.run_one_forward_step(wrapper.get_batch_for_context_window(inputs, 0, input_len))
    context.enable_decode_mode()
    window = wrapper.get_batch_for_context_window(inputs, input_len, input_len + 1)
    with torch.inference_mode(), Count() as count:
        wrapper.run_one_forward_step(window)
    return count.ops


def step_ops(model, input_len: int = 8, batch: int = 2) -> dict[str, float]:
    """Operators of one decode step of the worker: per layer and the step's own,
    kernels and views apart, and host syncs per layer."""
    import torch

    from autoconfig.profiling.cpu_bridge import cpu_bridge
    from autoconfig.profiling.saved_activations import _free_port

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", rank=0, world_size=1,
                                             init_method=f"tcp://127.0.0.1:{_free_port()}")
    def split(ops: collections.Counter) -> tuple[int, int]:
        views = sum(v for k, v in ops.items() if k in VIEW_OPS)
        return sum(ops.values()) - views, views

    def counted(narrow) -> dict[str, int]:
        with cpu_bridge():
            one, two = (_decode_step_ops(narrow, n, input_len, batch) for n in (1, 2))
        (k1, v1), (k2, v2) = split(one), split(two)
        layer = two - one
        return {"per_layer": k2 - k1, "per_step": k1 - (k2 - k1),
                "per_layer_views": v2 - v1, "per_step_views": v1 - (v2 - v1),
                "syncs_per_layer": sum(v for k, v in layer.items() if k in SYNC_OPS)}
    counts = counted(_narrow(model))
    if model.is_moe:
        few, many = COUNTED_EXPERTS
        more = counted(_narrow(model, many))
        per_expert = (more["per_layer"] - counts["per_layer"]) / (many - few)
        counts.update(per_local_expert=per_expert,
                      moe_fixed=counts["per_layer"] - per_expert * few)
    return counts


def main(argv: list[str] | None = None) -> int:
    from autoconfig.core.catalog import get_model
    from autoconfig.errors import AutoconfigError

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--size")
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        model = get_model(args.model, args.size)
        print(json.dumps(step_ops(model)))
    except AutoconfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
