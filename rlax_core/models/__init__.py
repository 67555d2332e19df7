"""Decoder-only transformers (Llama 2/3, Qwen2/2.5, Qwen3, and the mixtures of experts Mixtral, Qwen2-MoE,
Qwen3-MoE): config, forward, checkpoints, tokenizers.

See ``transformer.py`` for the model and the pluggable-attention contract, ``moe.py`` for the sparse
layers (routing, replay, expert parallelism), ``checkpoint.py`` for Hugging Face / llama2.c weights,
``tokenizer.py`` for tokenizers and chat templates.
"""

from rlax_core.utils.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "checkpoint": ["CheckpointError", "Model", "from_pretrained"],
    "saving": ["save_pretrained"],
    "config": ["ModelConfig", "MoeConfig", "RopeScaling", "toy_config", "toy_moe_config"],
    "moe": ["Routing", "load_balancing_loss", "router_z_loss"],
    "tokenizer": ["Tokenizer", "load_tokenizer"],
    "transformer": [
        "contiguous_attend", "default_positions", "forward", "forward_with_cache", "forward_with_routing",
        "fuse_projections", "init_cache", "init_params", "masked_attention", "param_logical_axes", "unstack_layers",
    ],
})
