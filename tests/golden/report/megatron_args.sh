# autoconfig: best plan for gpt3-1.3b on 2 x 8 a100-80gb (TP 1, PP 1, VP 1, CP 1, DP 16, SP off, MBS 2, recompute none, distributed optimizer on)
# add your data, tokenizer, optimizer and checkpoint arguments
export CUDA_DEVICE_MAX_CONNECTIONS=1
torchrun --nnodes 2 --nproc-per-node 8 \
    --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" \
  pretrain_gpt.py \
    --num-layers 24 \
    --hidden-size 2048 \
    --num-attention-heads 16 \
    --ffn-hidden-size 8192 \
    --seq-length 2048 \
    --max-position-embeddings 2048 \
    --tensor-model-parallel-size 1 \
    --pipeline-model-parallel-size 1 \
    --micro-batch-size 2 \
    --global-batch-size 96 \
    --use-distributed-optimizer \
    --bf16
