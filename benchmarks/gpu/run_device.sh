#!/usr/bin/env bash
# The measurements under benchmarks/gpu/, as run on a lent one-GPU H100 machine
# (PyTorch preinstalled, no network): megatron-core and submitit come as wheels
# in .whl/ (pip download --only-binary=:all: --python-version 3.12
# megatron-core==0.16.1 submitit==1.5.4).
#   bash benchmarks/gpu/run_device.sh OUTDIR STAGE...
# Stages (each time-limited; the first call ran "kernels train infer", the second
# "kernels2 infer2", the third "kernels3"):
#   kernels   benchmarks/gpu_kernels.py: HBM copy, bf16/FP8 GEMMs, fused attention
#   kernels2  benchmarks/gpu_kernels.py: GEMMs eager vs CUDA-graph replay (launch
#             cost apart, decode-sized M too), non-GEMM kernels
#   kernels3  benchmarks/gpu_kernels.py: one rank's attention kernels under ring
#             context parallelism (TE's load-balanced chunks), CP 1-32, 32K-512K tokens
#   train     `autoconfig search --profile --device cuda` on gpt3 1.3b, one GPU, as a
#             user runs it (real megatron-core steps of the top plans beside the
#             predictions of what ran: no Transformer Engine, so unfused attention)
#   infer     `autoconfig infer --profile --device cuda` (megatron-core static
#             inference) on gpt3 1.3b
#   infer2    the same on gpt3 350m and 6.7b (what part of a step does not shrink
#             with the model)
#   other     benchmarks/gpu_kernels.py on another card (a lent H200, 2026-11-27):
#             HBM, the FP8 recipes' GEMMs beside bf16, fused attention,
#             graph-replayed GEMMs, into other/
#   moe       benchmarks/gpu_kernels.py: one rank's MoE expert GEMMs at published
#             layouts (per-expert loop, FP8, grouped kernel), into moe/
#   moe_train `autoconfig search --profile --device cuda` on an inline 2.1B-parameter
#             MoE (12 layers, h 2048, 16 experts top 4, expert FFN 1536): real
#             megatron-core MoE steps (SequentialMLP, no Transformer Engine) beside
#             the predictions (2026-11-27, H200)
#   t5_train  the same on t5 3b (encoder-decoder), 512/128 tokens (2026-11-27, H200)
#   infer_static  the infer stages on gpt3 350m, 1.3b and 6.7b at batch 1, 8, 32 and 128,
#             predicted for the engine the worker runs (--engine megatron-core-static,
#             whose host cost per kernel was fitted on the H100 infer stages)
#   infer_llama   the same on llama3 8b (rotary, SwiGLU, GQA, no biases: the engine's
#             per-feature operator counts, predicted before this ran)
#   serving   benchmarks/gpu_kernels.py: served layers' weight GEMMs (Llama 2 70B TP 1-8,
#             Llama 3.1 405B TP 8, Llama 3 8B) at 1-8K tokens, bf16
#             and FP8, CUDA-graph replayed, into serving/ (2026-11-28, H200)
#   infer_moe the same on two MoE models, qwen3 30b-a3b (128 experts) and mixtral 8x7b
#             (8), 128 input and 8 output tokens at batch 1 and 16: the worker's
#             SequentialMLP calls every local expert (2026-11-28, H200)
#   infer_moe2 checks of the empty-expert host cost fitted on infer_moe's Qwen3 batch-1
#             TPOT, predicted before they ran (they refuted it; the engine file now
#             prices every expert alike): qwen3 30b-a3b at batch 4 and 64, and
#             tiny-moe (4 layers, 8 experts) at batch 1 and 16 (2026-11-28, H200)
#   infer_moe_repeat  infer_moe's Qwen3 runs again on a third machine (machine-to-machine
#             spread of the host-bound worker; 2026-11-28, H200)
#   AC_GPU=h200 names the catalog GPU the train and infer stages ask for (default h100).
set -u
gpu=${AC_GPU:-h100}
out=${1:?usage: run_device.sh OUTDIR STAGE...}
shift
mkdir -p "$out"
work=/tmp/ac-gpu
rm -rf "$work" && mkdir -p "$work"
if ls .whl/*.whl >/dev/null 2>&1; then  # the kernel stages need torch alone
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv
python3 -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"

infer_profile() {  # size, folder[, engine, batches, model]
    (cd "$work" && timeout 150 python3 -m autoconfig infer --model "${5:-gpt3}" --size "$1" \
        --gpu "$gpu" \
        --gpus 1 --gpus-per-node 1 --engine "${3:-megatron-core}" --input-len "${AC_IN:-512}" \
        --output-len "${AC_OUT:-64}" --batch "${4:-1,8,32}" --profile --device cuda --top-k 4 \
        --max-minutes 2 --no-plots -o "$2")
    echo "inference $1 rc $?"
}

for stage in "$@"; do
    echo "== $stage"
    case $stage in
    kernels)
        timeout 190 python3 benchmarks/gpu_kernels.py --out "$work/kernels" --budget-s 160 ;;
    kernels2)
        timeout 120 python3 benchmarks/gpu_kernels.py --out "$work/kernels2" --budget-s 100 \
            --only hbm,graph_gemm,elementwise ;;
    kernels3)
        timeout 150 python3 benchmarks/gpu_kernels.py --out "$work/kernels3" --budget-s 120 \
            --only ring_attention ;;
    train)
        (cd "$work" && timeout 200 python3 -m autoconfig search --model gpt3 --size 1.3b \
            --gpu "$gpu" --gpus-per-node 1 --nodes 1 --gbs 16 --seq-len 2048 --no-fused-attention \
            --no-gradient-accumulation-fusion --profile --device cuda --executor local \
            --top-k 4 --max-steps 5 --warmup-steps 2 --max-minutes 3 --no-plots -o train) ;;
    moe_train)
        (cd "$work" && timeout 240 python3 -m autoconfig search --layers 12 --hidden 2048 \
            --heads 16 --kv-heads 4 --swiglu --vocab 32000 --num-experts 16 --moe-topk 4 \
            --moe-ffn 1536 --gpu "$gpu" --gpus-per-node 1 --nodes 1 --gbs 16 --seq-len 2048 \
            --no-fused-attention --no-gradient-accumulation-fusion --profile --device cuda \
            --executor local --top-k 4 --max-steps 5 --warmup-steps 2 --max-minutes 3 \
            --no-plots -o train-moe) ;;
    t5_train)
        (cd "$work" && timeout 200 python3 -m autoconfig search --model t5 --size 3b \
            --gpu "$gpu" --gpus-per-node 1 --nodes 1 --gbs 32 --no-fused-attention \
            --no-gradient-accumulation-fusion --profile --device cuda --executor local \
            --top-k 4 --max-steps 5 --warmup-steps 2 --max-minutes 3 --no-plots -o train-t5) ;;
    other)
        timeout 300 python3 benchmarks/gpu_kernels.py --out "$work/other" --budget-s 220 \
            --only hbm,fp8_recipes,attention,graph_gemm ;;
    moe)
        timeout 120 python3 benchmarks/gpu_kernels.py --out "$work/moe" --budget-s 90 \
            --only grouped_gemm ;;
    serving)
        timeout 260 python3 benchmarks/gpu_kernels.py --out "$work/serving" --budget-s 220 \
            --only hbm,serving_gemm ;;
    infer)
        infer_profile 1.3b infer ;;
    infer2)
        infer_profile 350m infer-350m
        infer_profile 6.7b infer-6.7b ;;
    infer_static)
        for size in 350m 1.3b 6.7b; do
            infer_profile "$size" "infer-static-$size" megatron-core-static 1,8,32,128
        done ;;
    infer_llama)
        infer_profile 8b infer-static-llama3-8b megatron-core-static 1,8,32,128 llama3 ;;
    infer_moe)
        AC_IN=128 AC_OUT=8 infer_profile 30b-a3b infer-static-qwen3-30b-a3b \
            megatron-core-static 1,16 qwen3
        AC_IN=128 AC_OUT=8 infer_profile 8x7b infer-static-mixtral-8x7b \
            megatron-core-static 1,16 mixtral ;;
    infer_moe_repeat)
        AC_IN=128 AC_OUT=8 infer_profile 30b-a3b infer-repeat-qwen3-30b-a3b \
            megatron-core-static 1,16 qwen3 ;;
    infer_moe2)
        AC_IN=128 AC_OUT=8 infer_profile 30b-a3b infer-static-qwen3-30b-a3b-b4-64 \
            megatron-core-static 4,64 qwen3
        AC_IN=128 AC_OUT=8 infer_profile tiny infer-static-tiny-moe \
            megatron-core-static 1,16 tiny-moe ;;
    *)
        echo "unknown stage $stage" ;;
    esac
    echo "$stage rc $?"
done

tar -czf "$out/results.tar.gz" -C "$work" .
ls -la "$out"
