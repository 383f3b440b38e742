"""Launch specs the launch tests render: GPT-3 175B and Llama 3 8B/70B/405B plans,
bf16 and fp8, with VP, CP, recompute variants and an uneven pipeline split; and
mixture-of-experts plans (MOE_CASES) of three shapes built inline (the catalog's
MoE files are written separately): DeepSeek-V3 (MLA, MTP, three dense layers
first), Qwen3-30B-A3B (QK norm, kv_channels) and Mixtral 8x7B (GQA, ETP != TP);
and encoder-decoder plans (T5_CASES) of the catalog's T5 3B and mT5 11B."""

import json
from pathlib import Path

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.core.plan import Plan, Workload
from autoconfig.launch.spec import launch_spec
from autoconfig.training.stack import load_stack, with_overrides

DATA = Path(__file__).resolve().parent / "data"

CASES = {
    # name: (model, gpu, nodes, gbs, seq, precision, plan, stack or (stack, overrides))
    "gpt3-175b-bf16-vp-selective": ("gpt3-175b", "a100-80gb", 128, 1536, 2048, "bf16",
                                    Plan(tp=8, pp=8, dp=16, vp=3, sp=True, mbs=1,
                                         recompute="selective", distributed_optimizer=True),
                                    "megatron-lm"),
    "gpt3-175b-bf16-vp-blocking-p2p": ("gpt3-175b", "a100-80gb", 128, 1536, 2048, "bf16",
                                       Plan(tp=8, pp=8, dp=16, vp=2, sp=True, mbs=1,
                                            recompute="selective"),
                                       ("megatron-lm", {"overlap_p2p_comm": False})),
    "gpt3-175b-bf16-unfused-grad-accum": ("gpt3-175b", "a100-80gb", 128, 1536, 2048, "bf16",
                                          Plan(tp=8, pp=8, dp=16, sp=True, mbs=1,
                                               recompute="selective"),
                                          ("megatron-lm", {"gradient_accumulation_fusion": False})),
    "gpt3-175b-bf16-full-uniform": ("gpt3-175b", "a100-80gb", 128, 1536, 2048, "bf16",
                                    Plan(tp=8, pp=16, dp=8, mbs=1, recompute="full",
                                         recompute_method="uniform", recompute_num_layers=1),
                                    "megatron-lm"),
    "llama3-8b-fp8-cp": ("llama3-8b", "h100-80gb", 2, 128, 8192, "fp8",
                         Plan(tp=2, pp=1, dp=4, cp=2, sp=True, mbs=1,
                              distributed_optimizer=True), "nemo"),
    # Context parallelism by all-to-all (Ulysses, the heads split over cp) and
    # hierarchically (all-to-all inside a node, ring across: TP 2 leaves room for
    # a group of 4 there, so --hierarchical-context-parallel-sizes 4 2).
    "llama3-8b-128k-cp-a2a": ("llama3-8b", "h100-80gb", 2, 16, 131072, "bf16",
                              Plan(tp=1, pp=1, dp=2, cp=8, mbs=1, recompute="full",
                                   recompute_method="uniform", recompute_num_layers=1,
                                   distributed_optimizer=True),
                              ("nemo", {"cp_comm_type": "a2a"})),
    "llama3-8b-128k-cp-a2a-p2p": ("llama3-8b", "h100-80gb", 2, 16, 131072, "bf16",
                                  Plan(tp=2, pp=1, dp=1, cp=8, sp=True, mbs=1,
                                       recompute="full", recompute_method="uniform",
                                       recompute_num_layers=1, distributed_optimizer=True),
                                  ("megatron-lm", {"cp_comm_type": "a2a+p2p"})),
    "llama3-8b-fp8-blockwise": ("llama3-8b", "h100-80gb", 1, 128, 8192, "fp8",
                                Plan(tp=2, pp=1, dp=4, sp=True, mbs=1),
                                ("nemo", {"fp8_recipe": "blockwise"})),
    "llama3-8b-fp8-delayed-b200": ("llama3-8b", "b200", 1, 128, 8192, "fp8",
                                   Plan(tp=1, pp=1, dp=8, mbs=1),
                                   ("megatron-lm", {"fp8_recipe": "delayed"})),
    "llama3-8b-bf16-plain": ("llama3-8b", "h100-80gb", 1, 128, 8192, "bf16",
                             Plan(tp=1, pp=1, dp=8, mbs=1), "megatron-lm"),
    "llama3-70b-bf16-vp-full-block": ("llama3-70b", "h100-80gb", 64, 512, 8192, "bf16",
                                      Plan(tp=8, pp=4, dp=16, vp=5, sp=True, mbs=1,
                                           recompute="full", recompute_method="block",
                                           distributed_optimizer=True), "nemo"),
    "llama3-70b-fp8-cp-vp": ("llama3-70b", "h100-80gb", 64, 512, 8192, "fp8",
                             Plan(tp=4, pp=4, dp=16, vp=2, cp=2, sp=True, mbs=1,
                                  distributed_optimizer=True), "nemo"),
    "llama3-405b-fp8-uneven": ("llama3-405b", "h100-80gb", 256, 2048, 8192, "fp8",
                               Plan(tp=8, pp=16, dp=8, cp=2, sp=True, mbs=1, recompute="full",
                                    recompute_method="block", recompute_num_layers=2,
                                    distributed_optimizer=True, first_stage_layers=7,
                                    last_stage_layers=7), "nemo"),
    # Megatron-FSDP as Megatron-Bridge's llama3 70B GB200/GB300 FSDP recipes lay it out
    # (perf_recipes/llama: TP 1, DP 64, optim_grads_params, 20 layers' activations offloaded)
    "llama3-70b-fp8-megatron-fsdp": ("llama3-70b", "gb300", 16, 256, 8192, "fp8",
                                     Plan(tp=1, pp=1, dp=64, mbs=2, distributed_optimizer=True),
                                     ("nemo", {"fsdp_sharding": "full-shard",
                                               "cpu_offload_layers": 20})),
    "llama3-8b-bf16-offload": ("llama3-8b", "h100-80gb", 1, 128, 8192, "bf16",
                               Plan(tp=1, pp=1, dp=8, mbs=1),
                               ("megatron-lm", {"cpu_offload_layers": 8})),
    # NVFP4 as Megatron-Bridge's llama3_70b GB300 NVFP4 performance recipe lays it out
    "llama3-70b-nvfp4-gb300-vp": ("llama3-70b", "gb300", 16, 256, 8192, "nvfp4",
                                  Plan(tp=1, pp=4, dp=16, vp=5, mbs=1,
                                       distributed_optimizer=True), "nemo"),
    "llama3-405b-bf16-uneven-first": ("llama3-405b", "h100-80gb", 256, 2048, 8192, "bf16",
                                      Plan(tp=8, pp=8, dp=32, sp=True, mbs=1,
                                           distributed_optimizer=True, first_stage_layers=14),
                                      "megatron-lm"),
    "llama3-405b-bf16-embedding-split-vp": ("llama3-405b", "h100-80gb", 256, 2048, 8192,
                                            "bf16",
                                            Plan(tp=8, pp=8, dp=32, vp=2, sp=True, mbs=1,
                                                 distributed_optimizer=True,
                                                 first_stage_layers=15, last_stage_layers=15),
                                            "nemo"),
}


_LLAMA_LIKE = dict(mlp_kind="swiglu", norm_kind="rmsnorm", position_embedding="rope",
                   tied_embeddings=False, has_bias=False, hidden_dropout=0.0,
                   attention_dropout=0.0)
DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3", family="deepseek-v3", size_label="671b", num_layers=61,
    hidden_size=7168, num_heads=128, num_kv_heads=128, ffn_hidden_size=18432,
    vocab_size=129280, seq_len=4096, attention_kind="mla", q_lora_rank=1536,
    kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    num_experts=256, moe_topk=8, moe_ffn_hidden_size=2048,
    moe_shared_expert_ffn_hidden_size=2048, moe_first_dense_layers=3, mtp_layers=1,
    **_LLAMA_LIKE)
QWEN3_30B_A3B = ModelSpec(
    name="qwen3-30b-a3b", family="qwen3", size_label="30b-a3b", num_layers=48,
    hidden_size=2048, num_heads=32, num_kv_heads=4, kv_channels=128, qk_norm=True,
    ffn_hidden_size=768, vocab_size=151936, seq_len=4096, num_experts=128, moe_topk=8,
    moe_ffn_hidden_size=768, **_LLAMA_LIKE)
MIXTRAL_8X7B = ModelSpec(
    name="mixtral-8x7b", family="mixtral", size_label="8x7b", num_layers=32,
    hidden_size=4096, num_heads=32, num_kv_heads=8, ffn_hidden_size=14336, vocab_size=32000,
    seq_len=4096, num_experts=8, moe_topk=2, moe_ffn_hidden_size=14336, **_LLAMA_LIKE)
MOE_CASES = {
    # DeepSeek-V3 as Megatron-Bridge's 8-stage layout: 8 layers per stage, the last 5
    # (+ MTP); EP 64 over the 64 ranks of a stage; HybridEP.
    "deepseek-v3-ep64-pp8-hybridep": (DEEPSEEK_V3, "h100-80gb", 64, 4096, 4096, "bf16",
                                      Plan(tp=2, pp=8, dp=32, sp=True, mbs=1, ep=64,
                                           distributed_optimizer=True, last_stage_layers=5),
                                      ("nemo", {"moe_dispatcher": "flex-hybridep",
                                                "moe_a2a_overlap": False})),
    # 61 layers + embedding + loss = 63 = 3 stages x 3 chunks x 7: the one interleaved
    # split of an odd layer count; EP A2A overlap (needs VP with PP > 1, one MTP layer).
    "deepseek-v3-ep16-pp3-vp3-a2a": (DEEPSEEK_V3, "h100-80gb", 6, 768, 4096, "bf16",
                                     Plan(tp=2, pp=3, dp=8, vp=3, sp=True, mbs=1, ep=16,
                                          recompute="selective", distributed_optimizer=True,
                                          first_stage_layers=20, last_stage_layers=20),
                                     ("nemo", {"moe_a2a_overlap": True,
                                               "moe_dispatcher": "alltoall"})),
    # Megatron-Bridge's DeepSeek-V3 PP 4 VP 4 layout (Et*4|(t*4|)*14tmL): stages 16, 16,
    # 16, 13; needs --pipeline-model-parallel-layout (13 is not divisible by VP 4).
    "deepseek-v3-ep64-pp4-vp4-layout": (DEEPSEEK_V3, "gb200", 64, 4096, 4096, "bf16",
                                        Plan(tp=1, pp=4, dp=64, vp=4, mbs=1, ep=64,
                                             recompute="selective",
                                             recompute_modules="mla_up_proj",
                                             distributed_optimizer=True, last_stage_layers=13),
                                        ("nemo", {"moe_dispatcher": "flex-hybridep",
                                                  "moe_a2a_overlap": True})),
    # CUDA graphs as megatron-core 0.16 takes them: TE's scopes, and a whole
    # iteration (local graphs: NaN check off, experts padded with EP > 1).
    "qwen3-30b-a3b-ep8-te-graphs": (QWEN3_30B_A3B, "b200", 1, 512, 4096, "bf16",
                                    Plan(tp=1, pp=1, dp=8, mbs=4, ep=8,
                                         distributed_optimizer=True),
                                    ("nemo", {"moe_dispatcher": "flex-hybridep",
                                              "cuda_graph": "te-scoped"})),
    "qwen3-30b-a3b-ep8-full-graph": (QWEN3_30B_A3B, "b200", 1, 512, 4096, "bf16",
                                     Plan(tp=1, pp=1, dp=8, mbs=4, ep=8,
                                          distributed_optimizer=True),
                                     ("nemo", {"moe_dispatcher": "flex-hybridep",
                                               "moe_a2a_overlap": False,
                                               "cuda_graph": "full-iteration"})),
    "qwen3-30b-a3b-ep8": (QWEN3_30B_A3B, "h100-80gb", 2, 512, 4096, "bf16",
                          Plan(tp=1, pp=2, dp=8, mbs=1, ep=8, distributed_optimizer=True),
                          "megatron-lm"),
    # GPT-OSS: 128-token banded attention every other layer, learned attention sinks
    # (Megatron-Bridge's own GPT-OSS recipe builds it; Megatron-LM from the arguments).
    "gpt-oss-120b-ep8": ("gpt-oss-120b", "b200", 8, 512, 4096, "bf16",
                         Plan(tp=1, pp=1, dp=64, mbs=1, ep=8, distributed_optimizer=True),
                         ("nemo", {"moe_dispatcher": "alltoall"})),
    "mixtral-8x7b-etp2": (MIXTRAL_8X7B, "h100-80gb", 8, 512, 4096, "bf16",
                          Plan(tp=4, pp=4, dp=4, sp=True, mbs=1, ep=8, etp=2,
                               recompute="full", recompute_method="uniform",
                               recompute_num_layers=1, distributed_optimizer=True),
                          ("nemo", {"moe_a2a_overlap": True, "moe_dispatcher": "alltoall"})),
}
ALL_CASES = {**CASES, **MOE_CASES}

# Encoder-decoder plans (kept out of ALL_CASES, whose GPT checks read --num-layers):
# the NeMo launcher's own layouts on 20 nodes of 8 GPUs (conf/training/t5/3b.yaml:
# TP 2, micro-batch 24, full block recompute; mt5/11b.yaml: TP 4) and variants of
# them: SP on and off, full block with a layer count, uniform, selective, the
# distributed optimizer on and off, FP8.
T5_CASES = {
    "t5-3b-tp2-full-block": ("t5-3b", "a100-80gb", 20, 1920, 512, "bf16",
                             Plan(tp=2, pp=1, dp=80, mbs=24, recompute="full",
                                  recompute_method="block", distributed_optimizer=True),
                             "megatron-lm"),
    "t5-3b-tp2-sp-full-block12": ("t5-3b", "h100-80gb", 20, 1920, 512, "bf16",
                                  Plan(tp=2, pp=1, dp=80, sp=True, mbs=24, recompute="full",
                                       recompute_method="block", recompute_num_layers=12,
                                       distributed_optimizer=True), "nemo"),
    "t5-3b-tp4-selective": ("t5-3b", "h100-80gb", 20, 1920, 512, "bf16",
                            Plan(tp=4, pp=1, dp=40, mbs=12, recompute="selective"),
                            "megatron-lm"),
    "mt5-11b-tp4-sp-full-block": ("mt5-11b", "h100-80gb", 20, 1920, 512, "bf16",
                                  Plan(tp=4, pp=1, dp=40, sp=True, mbs=24, recompute="full",
                                       recompute_method="block", distributed_optimizer=True),
                                  "nemo"),
    "mt5-11b-tp4-full-uniform": ("mt5-11b", "a100-80gb", 20, 1920, 512, "bf16",
                                 Plan(tp=4, pp=1, dp=40, mbs=12, recompute="full",
                                      recompute_method="uniform", recompute_num_layers=1,
                                      distributed_optimizer=True), "megatron-lm"),
    "mt5-11b-tp2-fp8-selective": ("mt5-11b", "h100-80gb", 20, 1920, 512, "fp8",
                                  Plan(tp=2, pp=1, dp=80, sp=True, mbs=8,
                                       recompute="selective", distributed_optimizer=True),
                                  "nemo"),
}


def case_spec(name: str, base=None):
    model, gpu, nodes, gbs, seq, precision, plan, stack = {**ALL_CASES, **T5_CASES}[name]
    stack, overrides = stack if isinstance(stack, tuple) else (stack, {})
    chosen = load_stack(stack)
    model = get_model(model) if isinstance(model, str) else model
    return launch_spec(model, Workload(gbs, seq, precision), plan,
                       Cluster(get_gpu(gpu), nodes, get_gpu(gpu).gpus_per_node),
                       software=with_overrides(chosen.features, **overrides),
                       stack=chosen.name, base=base)


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())
