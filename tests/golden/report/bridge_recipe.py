"""Megatron-Bridge (NeMo 2) pre-training of the best plan, written by autoconfig.

autoconfig: gpt3-1.3b on 2 x 8 a100-80gb, stack megatron-lm
hyper-parameters: autoconfig base defaults for gpt3-1.3b (no --base given: Chinchilla tokens, GPT-3 LR table and schedule)
schedule: 12868096 samples (2.635e+10 tokens), lr 0.0002 -> 2e-05 cosine, warm-up 183296 samples, decay 11152896 samples

Run: torchrun --nproc-per-node <GPUs> bridge_recipe.py (one node), or
sbatch launch_bridge.sbatch. DATA_PATH (a preprocessed dataset prefix) selects
real data, otherwise the recipe's mock data; CHECKPOINT_DIR saves and resumes.
"""

import os

import torch.nn.functional as F
from megatron.core.transformer.enums import AttnBackend
from megatron.bridge.recipes.gpt.gpt3_175b import gpt3_175b_pretrain_config
from megatron.bridge.training.comm_overlap import CommOverlapConfig
from megatron.bridge.training.gpt_step import forward_step
from megatron.bridge.training.mixed_precision import get_mixed_precision_config
from megatron.bridge.training.pretrain import pretrain


def autoconfig_config():
    """gpt3_175b_pretrain_config() with the model, plan, stack and schedule autoconfig chose."""
    cfg = gpt3_175b_pretrain_config()
    cfg.mixed_precision = get_mixed_precision_config('bf16_mixed')
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)
    cfg.model.num_layers = 24
    cfg.model.hidden_size = 2048
    cfg.model.ffn_hidden_size = 8192
    cfg.model.num_attention_heads = 16
    cfg.model.num_query_groups = 16
    cfg.model.seq_length = 2048
    cfg.model.normalization = 'LayerNorm'
    cfg.model.gated_linear_unit = False
    cfg.model.activation_func = F.gelu
    cfg.model.add_bias_linear = True
    cfg.model.position_embedding_type = 'learned_absolute'
    cfg.model.share_embeddings_and_output_weights = True
    cfg.model.hidden_dropout = 0.1
    cfg.model.attention_dropout = 0.1
    cfg.model.init_method_std = 0.0139754
    cfg.model.make_vocab_size_divisible_by = 1024
    cfg.model.tensor_model_parallel_size = 1
    cfg.model.pipeline_model_parallel_size = 1
    cfg.model.virtual_pipeline_model_parallel_size = None
    cfg.model.num_layers_in_first_pipeline_stage = None
    cfg.model.num_layers_in_last_pipeline_stage = None
    cfg.model.context_parallel_size = 1
    cfg.model.sequence_parallel = False
    cfg.model.cp_comm_type = None
    cfg.model.hierarchical_context_parallel_sizes = None
    cfg.model.recompute_granularity = None
    cfg.model.recompute_method = None
    cfg.model.recompute_num_layers = None
    cfg.model.attention_backend = AttnBackend.fused
    cfg.train.train_iters = 134043
    cfg.train.global_batch_size = 96
    cfg.train.micro_batch_size = 2
    cfg.scheduler.lr_decay_style = 'cosine'
    cfg.scheduler.lr_warmup_iters = 1910
    cfg.scheduler.lr_decay_iters = 116176
    cfg.optimizer.lr = 0.0002
    cfg.optimizer.min_lr = 2e-05
    cfg.optimizer.weight_decay = 0.1
    cfg.optimizer.adam_beta1 = 0.9
    cfg.optimizer.adam_beta2 = 0.95
    cfg.optimizer.adam_eps = 1e-08
    cfg.optimizer.clip_grad = 1
    cfg.optimizer.use_distributed_optimizer = True
    cfg.ddp.use_distributed_optimizer = True
    cfg.ddp.use_megatron_fsdp = False
    cfg.ddp.overlap_grad_reduce = False
    cfg.ddp.overlap_param_gather = False
    cfg.ddp.grad_reduce_in_fp32 = True
    cfg.model.gradient_accumulation_fusion = True
    cfg.model.cuda_graph_impl = 'none'
    cfg.model.cuda_graph_scope = []
    cfg.model.cross_entropy_loss_fusion = False
    cfg.mixed_precision.grad_reduce_in_fp32 = True
    cfg.dataset.seq_length = 2048
    cfg.tokenizer.tokenizer_type = 'HuggingFaceTokenizer'
    cfg.tokenizer.tokenizer_model = 'gpt2'
    data_path = os.environ.get("DATA_PATH")
    if data_path:
        cfg.dataset.blend = ([data_path], None)
    checkpoint_dir = os.environ.get("CHECKPOINT_DIR")
    if checkpoint_dir:
        cfg.checkpoint.save = checkpoint_dir
        cfg.checkpoint.load = checkpoint_dir
    return cfg


if __name__ == "__main__":
    pretrain(config=autoconfig_config(), forward_step_func=forward_step)
