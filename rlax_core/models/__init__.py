"""Decoder-only transformers (Llama 2/3, Qwen2/2.5, Qwen3): config, forward, checkpoints, tokenizers.

See ``transformer.py`` for the model and the pluggable-attention contract, ``checkpoint.py`` for
Hugging Face / llama2.c weights, ``tokenizer.py`` for tokenizers and chat templates.
"""

from rlax_core.models.checkpoint import CheckpointError, Model, from_pretrained, save_pretrained
from rlax_core.models.config import ModelConfig, RopeScaling, toy_config
from rlax_core.models.tokenizer import Tokenizer, load_tokenizer
from rlax_core.models.transformer import (
    contiguous_attend,
    default_positions,
    forward,
    forward_with_cache,
    fuse_projections,
    init_cache,
    init_params,
    masked_attention,
    param_logical_axes,
    unstack_layers,
)

__all__ = [
    "CheckpointError", "Model", "ModelConfig", "RopeScaling", "contiguous_attend", "default_positions", "forward",
    "forward_with_cache", "fuse_projections", "from_pretrained", "init_cache", "init_params", "masked_attention",
    "param_logical_axes", "save_pretrained", "toy_config", "Tokenizer", "load_tokenizer", "unstack_layers",
]
