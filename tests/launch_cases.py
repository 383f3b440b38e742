"""Launch specs the launch tests render: GPT-3 175B and Llama 3 8B/70B/405B plans,
bf16 and fp8, with VP, CP, recompute variants and an uneven pipeline split."""

import json
from pathlib import Path

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
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
    "gpt3-175b-bf16-full-uniform": ("gpt3-175b", "a100-80gb", 128, 1536, 2048, "bf16",
                                    Plan(tp=8, pp=16, dp=8, mbs=1, recompute="full",
                                         recompute_method="uniform", recompute_num_layers=1),
                                    "megatron-lm"),
    "llama3-8b-fp8-cp": ("llama3-8b", "h100-80gb", 2, 128, 8192, "fp8",
                         Plan(tp=2, pp=1, dp=4, cp=2, sp=True, mbs=1,
                              distributed_optimizer=True), "nemo"),
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


def case_spec(name: str, base=None):
    model, gpu, nodes, gbs, seq, precision, plan, stack = CASES[name]
    stack, overrides = stack if isinstance(stack, tuple) else (stack, {})
    chosen = load_stack(stack)
    return launch_spec(get_model(model), Workload(gbs, seq, precision), plan,
                       Cluster(get_gpu(gpu), nodes, get_gpu(gpu).gpus_per_node),
                       software=with_overrides(chosen.features, **overrides),
                       stack=chosen.name, base=base)


def recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())
