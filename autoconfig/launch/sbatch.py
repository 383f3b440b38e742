"""launch.sbatch: the run as a SLURM batch script.

One task per GPU (``--ntasks-per-node`` = GPUs per node); every task gets the
torch.distributed environment Megatron-LM reads (RANK, LOCAL_RANK, WORLD_SIZE
from SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS; MASTER_ADDR = the first host of
``scontrol show hostnames``), so the rendezvous works across nodes without
torchrun. The program is a parameter: pretrain_gpt.py with the Megatron-LM
arguments for users, the project's own profiling worker in the SLURM test, so
the test runs the very template users get. Optional pyxis container flags.
The script passes shellcheck (tests/test_launch_sbatch.py).
"""

import shlex

from autoconfig.launch.megatron_lm import (argument_arrays, megatron_notes, pretrain_script,
                                           shell_word)
from autoconfig.launch.spec import LaunchSpec

MASTER_PORT = 6000
MEGATRON_LM_DEFAULT = "/opt/megatron-lm"
P2P_CHUNK_BYTES = 2097152
ALLOCATOR_ENV = ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
"""PyTorch's allocator maps memory on demand in growable segments, so little of the
cache is stranded between blocks: the memory model's megatron-core fragmentation
factor (heuristics/memory.yaml) assumes it, and the profiling worker runs with it."""


def environment(spec: LaunchSpec) -> list[tuple[str, str, str]]:
    """(variable, value, why) the job exports for this plan and stack."""
    plan, gpu, moe = spec.plan, spec.cluster.gpu.name, spec.moe
    blackwell = gpu.startswith(("b200", "b300", "gb200", "gb300"))
    a2a_overlap = moe is not None and moe.a2a_overlap
    if blackwell or spec.software.megatron_fsdp:
        # Megatron-FSDP asserts CUDA_DEVICE_MAX_CONNECTIONS != 1 (Megatron-LM
        # arguments.py); Megatron-Bridge's FSDP recipes set 32 (perf_recipes/llama).
        connections = "32"
    elif (plan.tp > 1 or plan.cp > 1) and not a2a_overlap:
        connections = "1"
    else:
        connections = "32" if moe is not None and moe.flex_backend else "8"
    why = ("one hardware queue keeps TP/CP communication ahead of the GEMMs it overlaps "
           "(Megatron-LM asks for 1 with sequence parallelism; Megatron-Bridge "
           "scripts/performance/utils/overrides.py: 1 for TP/CP > 1, 32 on Blackwell, else 8)")
    if moe is not None:
        why = ("hardware queues: 1 keeps TP/CP communication ahead of the GEMMs it overlaps, "
               "more let EP all-to-all overlap run beside compute (Megatron-Bridge "
               "scripts/performance/utils/overrides.py: 1 for TP/CP > 1 without MoE A2A "
               "overlap, 32 on Blackwell or with DeepEP/HybridEP, else 8; Megatron-LM "
               "asks for 1 with TP/CP unless --overlap-moe-expert-parallel-comm)")
    env = [("CUDA_DEVICE_MAX_CONNECTIONS", connections, why),
           (*ALLOCATOR_ENV, "growable allocator segments strand less memory (Megatron-Bridge "
            "v0.4.0 performance guide against segmentation; its performance scripts set it for "
            "DeepSeek-V3 and Llama 3.1 405B); the memory prediction assumes it")]
    if moe is not None and moe.flex_backend == "hybridep":
        domain = 72 if gpu.startswith(("gb200", "gb300")) else spec.cluster.gpus_per_node
        env.append(("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", str(min(plan.ep, domain)),
                    "HybridEP's expert ranks per NVLink domain (Megatron-Bridge "
                    "scripts/performance/utils/overrides.py: min(EP, 8) on H100/B200, EP on "
                    "GB200/GB300 NVL72)"))
    if plan.pp > 1:
        env.append(("NCCL_P2P_NET_CHUNKSIZE", str(P2P_CHUNK_BYTES),
                    "larger pipeline send chunks across nodes (Megatron-Bridge performance "
                    "overrides for Llama 3 70B/405B pre-training with PP > 1)"))
    if spec.tp_comm_overlap:
        env.append(("NVTE_FWD_LAYERNORM_SM_MARGIN", "16",
                    "leave SMs for the userbuffers TP overlap (Transformer Engine)"))
        env.append(("NVTE_BWD_LAYERNORM_SM_MARGIN", "16",
                    "leave SMs for the userbuffers TP overlap (Transformer Engine)"))
    return env


def _directives(spec: LaunchSpec, time_limit_min: int | None) -> list[str]:
    c, s = spec.cluster, spec.slurm
    lines = [f"#SBATCH --job-name={s.job_name}", f"#SBATCH --nodes={c.nodes}",
             f"#SBATCH --ntasks-per-node={c.gpus_per_node}"]
    if s.request_gpus:
        lines += [f"#SBATCH --gpus-per-node={c.gpus_per_node}", "#SBATCH --exclusive"]
    if time_limit_min:
        lines.append(f"#SBATCH --time={time_limit_min // 60:02d}:{time_limit_min % 60:02d}:00")
    for key in ("partition", "account", "qos"):
        value = getattr(s, key)
        if value:
            lines.append(f"#SBATCH --{key}={value}")
    return lines + ["#SBATCH --output=%x-%j.out"]


def _submit_lines(spec: LaunchSpec, megatron: bool) -> list[str]:
    """How to submit it and which variables to set (T5: real data, its tokenizer file)."""
    t5 = spec.model.is_encoder_decoder
    if not megatron:
        submit = []
    elif t5:
        submit = ["# Submit: sbatch launch.sbatch  (real data only: pretrain_t5.py has no "
                  "synthetic data)"]
    else:
        submit = ["# Submit: sbatch launch.sbatch  (MOCK_DATA=1 sbatch launch.sbatch: "
                  "synthetic data)"]
    tokenizer = ("VOCAB_FILE or TOKENIZER_MODEL, the tokenizer" if t5
                 else "VOCAB_FILE/MERGE_FILE for GPT-2 BPE")
    return submit + [f"# Set DATA_PATH (and {tokenizer}), CHECKPOINT_DIR, LOG_DIR,"]


def render_sbatch(spec: LaunchSpec, program: list[str] | None = None,
                  program_args: list[str] | None = None) -> str:
    """The batch script. Default program: ``python $MEGATRON_LM/pretrain_gpt.py``
    (pretrain_t5.py for T5) with the arrays of megatron_lm.argument_arrays; otherwise
    ``program program_args``."""
    megatron = program is None
    head = ["#!/bin/bash"] + _directives(spec, spec.slurm.time_limit_min)
    head += [f"# {line}" for line in spec.describe()
             + (megatron_notes(spec) if megatron else [])]
    head += [] if megatron else [f"# Runs: {' '.join(program)} on every task"]
    head += _submit_lines(spec, megatron)
    head += [
             f"# MEGATRON_LM (a Megatron-LM checkout, default {MEGATRON_LM_DEFAULT}) and",
             "# CONTAINER_IMAGE (pyxis/enroot image; empty: run on the host).",
             "set -euo pipefail", ""]
    body = []
    for name, value, why in environment(spec):
        body += [f"# {why}", f"export {name}={value}"]
    body += ["",
             "# rendezvous: the first node of the allocation; each task sets its own rank below",
             'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
             f'MASTER_PORT=${{MASTER_PORT:-{MASTER_PORT}}}',
             "export MASTER_ADDR MASTER_PORT", ""]
    if megatron:
        body += [f'MEGATRON_LM="${{MEGATRON_LM:-{MEGATRON_LM_DEFAULT}}}"',
                 f'PROGRAM=(python "$MEGATRON_LM/{pretrain_script(spec)}")']
        body += argument_arrays(spec)
    else:
        body += ["PROGRAM=(" + " ".join(shell_word(t) for t in program) + ")",
                 "MEGATRON_ARGS=(" + " ".join(shlex.quote(t) for t in program_args or [])
                 + ")"]
    image = spec.slurm.container_image or ""
    body += ["",
             f'CONTAINER_IMAGE="${{CONTAINER_IMAGE:-{image}}}"',
             "CONTAINER_ARGS=()",
             'if [[ -n "$CONTAINER_IMAGE" ]]; then',
             '    CONTAINER_ARGS=(--container-image "$CONTAINER_IMAGE"',
             '                    --container-mounts "${CONTAINER_MOUNTS:-$PWD:$PWD}"',
             '                    --container-workdir "$PWD")',
             "fi", "",
             "# one task per GPU; RANK/LOCAL_RANK/WORLD_SIZE come from SLURM inside each task",
             "# shellcheck disable=SC2016  # the single-quoted variables expand in each task",
             'srun --kill-on-bad-exit=1 "${CONTAINER_ARGS[@]}" bash -c \\',
             "    'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS;"
             ' exec "$@"\' \\',
             '    task "${PROGRAM[@]}" "${MEGATRON_ARGS[@]}"']
    return "\n".join(head + body) + "\n"
