"""A projection's product as the transformer's modules run it: plain, eight-bit, with an adapter.

    y = project(module, "q_proj", x, dense, input_axes=1, dropout=0.0)

``dense`` builds the projection's Flax layer (its parameters and initialisers). With a float kernel
it runs as built. With an eight-bit kernel (``lora.quantize_kernels``: int8 or float8 with a float32
``kernel_scale`` per output channel, the QLoRA base and the engine's ``weight_dtype``) the layer is
not called: x meets the eight-bit kernel in one ``dot_general`` with a float32 accumulator, and the
per-channel scale multiplies the product (x @ (q * s) = (x @ q) * s), so no dequantized copy of the
kernel is formed. A projection holding an adapter (``lora.with_adapters``) adds (x @ A) @ B.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlax_core.models.lora import low_rank_term

LORA_DROPOUT_RNG = "lora_dropout"  # the rng stream of LoRA dropout (``forward(..., lora_dropout_rng=)``)


def scaled_product(x: jax.Array, kernel: jax.Array, kernel_scale: jax.Array, input_axes: int) -> jax.Array:
    """x's trailing ``input_axes`` contracted with an eight-bit kernel's leading ones, in float32,
    times the scale per output channel. JAX lowers the mixed operands to a product whose eight-bit
    side XLA widens inside the product's fusion (int8 x bf16, "weight-only" quantization)."""
    contract = (tuple(range(x.ndim - input_axes, x.ndim)), tuple(range(input_axes)))
    y = jax.lax.dot_general(x, kernel, (contract, ((), ())), preferred_element_type=jnp.float32)
    return y * kernel_scale


def project(module: nn.Module, name: str, x: jax.Array, dense: Callable[[], nn.Module], *, input_axes: int,
            dropout: float) -> jax.Array:
    """The projection ``name`` of ``module`` applied to ``x`` (see the module's docstring); x dropped
    element-wise at rate ``dropout`` before an adapter when the apply has a LoRA dropout rng
    (training), as PEFT drops the adapter's input."""
    leaves = module.variables.get("params", {}).get(name, {})
    if "kernel_scale" in leaves:
        y = scaled_product(x, leaves["kernel"], leaves["kernel_scale"], input_axes)
        if "bias" in leaves:
            y = y + leaves["bias"].astype(jnp.float32)
        y = y.astype(x.dtype)
    else:
        y = dense()(x)
    if "lora_a" not in leaves:
        return y
    if dropout > 0 and module.has_rng(LORA_DROPOUT_RNG):
        keep = jax.random.bernoulli(module.make_rng(LORA_DROPOUT_RNG), 1.0 - dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - dropout), jnp.zeros_like(x))
    return (y.astype(jnp.float32) + low_rank_term(x, leaves["lora_a"], leaves["lora_b"])).astype(y.dtype)
