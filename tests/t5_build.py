"""Build megatron-core's T5Model on CPU in a child process and count its
parameters (a process of its own: model-parallel state is global)."""

import json
import socket
import subprocess
import sys
from dataclasses import asdict

from autoconfig.core.model import ModelSpec

_CHILD = r"""
import json, os, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
import torch.nn.functional as F
from copy import deepcopy
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=0, world_size=1)
from megatron.core import parallel_state
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.models.T5 import T5Model
from megatron.core.models.T5.t5_spec import (decoder_model_with_local_spec,
                                             encoder_model_with_local_spec)
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig
m = json.loads(sys.argv[1])
enc_layers = m["num_layers"] - m["decoder_layers"]
config = TransformerConfig(
    num_layers=m["decoder_layers"], hidden_size=m["hidden_size"],
    num_attention_heads=m["num_heads"], kv_channels=m["kv_channels"] or None,
    ffn_hidden_size=m["ffn_hidden_size"], gated_linear_unit=m["mlp_kind"] != "gelu",
    activation_func=F.gelu, add_bias_linear=m["has_bias"], use_cpu_initialization=True,
    normalization="RMSNorm" if m["norm_kind"] == "rmsnorm" else "LayerNorm")
encoder_config = deepcopy(config)
encoder_config.num_layers = enc_layers
model = T5Model(
    config=config, encoder_config=encoder_config,
    transformer_encoder_layer_spec=TransformerBlockSubmodules(
        [encoder_model_with_local_spec()] * enc_layers, layer_norm=WrappedTorchNorm),
    transformer_decoder_layer_spec=TransformerBlockSubmodules(
        [decoder_model_with_local_spec()] * m["decoder_layers"], layer_norm=WrappedTorchNorm),
    vocab_size=m["vocab_size"], max_sequence_length=m["seq_len"],
    share_embeddings_and_output_weights=m["tied_embeddings"],
    position_embedding_type={"learned": "learned_absolute"}.get(m["position_embedding"],
                                                               m["position_embedding"]))
print(sum(p.numel() for p in model.parameters()))
"""


def count_megatron_t5_params(model: ModelSpec) -> int:
    with socket.socket() as sock:  # a free port for the one-process gloo group
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(asdict(model)), port],
                         capture_output=True, text=True, timeout=300, check=True)
    return int(out.stdout.strip().splitlines()[-1])
