#!/bin/bash
# Megatron-LM pretrain_gpt.py arguments of the best plan. Source it:
#   source megatron_args.sh && torchrun ... pretrain_gpt.py "${MEGATRON_ARGS[@]}"
# or submit launch.sbatch, which carries the same arguments.
# autoconfig: gpt3-1.3b on 2 x 8 a100-80gb, stack megatron-lm
# hyper-parameters: autoconfig base defaults for gpt3-1.3b (no --base given: Chinchilla tokens, GPT-3 LR table and schedule)
# schedule: 12868096 samples (2.635e+10 tokens), lr 0.0002 -> 2e-05 cosine, warm-up 183296 samples, decay 11152896 samples
# shellcheck disable=SC2034  # used by whoever sources this
LOG_DIR="${LOG_DIR:-$PWD/log}"  # where TensorBoard logs go
CHECKPOINT_DIR="${CHECKPOINT_DIR:-$PWD/checkpoint}"  # where checkpoints are saved and resumed from
# model shape and architecture
MODEL_ARGS=(
    --num-layers 24
    --hidden-size 2048
    --ffn-hidden-size 8192
    --num-attention-heads 16
    --seq-length 2048
    --max-position-embeddings 2048
    --normalization LayerNorm
    --position-embedding-type learned_absolute
    --attention-dropout 0.1
    --hidden-dropout 0.1
    --init-method-std 0.0139754
    --make-vocab-size-divisible-by 1024
)
# the parallel plan
PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --micro-batch-size 2
    --global-batch-size 96
    --use-distributed-optimizer
)
# software features the prediction assumed
STACK_ARGS=(
    --transformer-impl transformer_engine
    --attention-backend fused
)
# precision
PRECISION_ARGS=(
    --bf16
)
# token budget, LR schedule, optimizer (base config)
SCHEDULE_ARGS=(
    --train-samples 12868096
    --lr 0.0002
    --min-lr 2e-05
    --lr-decay-style cosine
    --lr-warmup-samples 183296
    --lr-decay-samples 11152896
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --adam-eps 1e-08
    --clip-grad 1
)
# checkpoints and logs (placeholders)
OUTPUT_ARGS=(
    --save "$CHECKPOINT_DIR"
    --load "$CHECKPOINT_DIR"
    --save-interval 1000
    --log-interval 10
    --eval-interval 1000
    --eval-iters 10
    --tensorboard-dir "$LOG_DIR/tensorboard"
)
# data and tokenizer: MOCK_DATA=1 for a smoke test on synthetic data
if [[ "${MOCK_DATA:-0}" == 1 ]]; then
    DATA_ARGS=(
        --mock-data
        --tokenizer-type NullTokenizer
        --vocab-size 50256
    )
else
    : "${DATA_PATH:?set DATA_PATH: prefix of your preprocessed dataset (tools/preprocess_data.py output, without .bin/.idx)}"
    : "${VOCAB_FILE:?set VOCAB_FILE: GPT-2 BPE vocab.json}"
    : "${MERGE_FILE:?set MERGE_FILE: GPT-2 BPE merges.txt}"
    DATA_ARGS=(
        --data-path "$DATA_PATH"
        --split '99,1,0'
        --tokenizer-type GPT2BPETokenizer
        --vocab-file "$VOCAB_FILE"
        --merge-file "$MERGE_FILE"
    )
fi
MEGATRON_ARGS=("${MODEL_ARGS[@]}" "${PARALLEL_ARGS[@]}" "${STACK_ARGS[@]}" "${PRECISION_ARGS[@]}" "${SCHEDULE_ARGS[@]}" "${OUTPUT_ARGS[@]}" "${DATA_ARGS[@]}")
