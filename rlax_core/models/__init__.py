"""Decoder-only transformers (Llama 2/3, Qwen2/2.5, Qwen3, and the mixtures of experts Mixtral, Qwen2-MoE,
Qwen3-MoE): config, forward, checkpoints, tokenizers.

See ``transformer.py`` for the model and the pluggable-attention contract, ``moe.py`` for the sparse
layers (routing, replay, expert parallelism), ``checkpoint.py`` for Hugging Face / llama2.c weights,
``tokenizer.py`` for tokenizers and chat templates.
"""

from rlax_core.models.checkpoint import CheckpointError, Model, from_pretrained
from rlax_core.models.saving import save_pretrained
from rlax_core.models.config import ModelConfig, MoeConfig, RopeScaling, toy_config, toy_moe_config
from rlax_core.models.moe import Routing, load_balancing_loss, router_z_loss
from rlax_core.models.tokenizer import Tokenizer, load_tokenizer
from rlax_core.models.transformer import (
    contiguous_attend,
    default_positions,
    forward,
    forward_with_cache,
    forward_with_routing,
    fuse_projections,
    init_cache,
    init_params,
    masked_attention,
    param_logical_axes,
    unstack_layers,
)

__all__ = [
    "CheckpointError", "Model", "ModelConfig", "MoeConfig", "RopeScaling", "Routing", "contiguous_attend",
    "default_positions", "forward", "forward_with_cache", "forward_with_routing", "fuse_projections", "from_pretrained",
    "init_cache", "init_params", "load_balancing_loss", "masked_attention", "param_logical_axes", "router_z_loss",
    "save_pretrained", "toy_config", "toy_moe_config", "Tokenizer", "load_tokenizer", "unstack_layers",
]
