"""The memory model's layer widths against what megatron-core's autograd really keeps.

``autoconfig.profiling.saved_activations`` builds the profiling worker's GPT layers
(megatron-core local layers, bf16, CPU) and counts the storages the backward keeps.
For a GPT-3 layer (LayerNorm, GeLU, biases) everything but the attention
probabilities must be exactly ``layer_stored_widths`` (Korthikanti's 34 s b h less
the two dropout masks the worker trains without). The probabilities take 6 bytes
a score there (PyTorch softmax in fp32, then its bf16 copy), not the 2 of a fused
softmax kernel: the reason a GPU profile without TransformerEngine measures above
its prediction (benchmarks/gpu/README.md).
"""

import json
import subprocess
import sys

import pytest

pytest.importorskip("megatron.core")


def _measure(model: str, size: str, seq_len: int) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "autoconfig.profiling.saved_activations", "--model", model,
         "--size", size, "--seq-len", str(seq_len)],
        capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_gpt_layer_keeps_what_the_memory_model_counts():
    seq, heads, hidden = 256, 12, 768   # gpt3-126m
    kept = _measure("gpt3", "126m", seq)
    assert kept["other_bytes"] == kept["predicted_other_bytes"] == 32 * seq * hidden
    assert kept["scores_bytes"] == (4 + 2) * heads * seq * seq
