"""The policy's log-probs of the tokens it sampled, and its entropy: what the trainer's objective reads.

Logits and log-softmax in float32 (the engine's behaviour log-probs are too), so that the trainer's
old log-probs of a batch equal the engine's up to numerics and the ratio of a policy with itself is
exactly 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from rlax_core.models.attention import AttentionImpl
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import forward


def token_logprobs(params, config: ModelConfig, tokens, attention_mask=None, *, remat: bool = False,
                   attention: AttentionImpl = "dense", mesh: Mesh | None = None, lora_dropout: float = 0.0,
                   lora_dropout_rng: jax.Array | None = None, segment_ids=None, positions=None, routed_experts=None):
    """log pi(token t+1 | tokens <= t) and the entropy of that distribution, both [B, T-1] float32.
    ``lora_dropout``/``lora_dropout_rng``, ``segment_ids``/``positions`` (packed rows): see
    ``models.transformer.forward``. At a segment's last token the target is the next segment's first:
    that position is no sample's (``packing.rows_to_samples`` never reads it unmasked).
    ``routed_experts`` [B, T, moe_layers, k] (a mixture of experts): run those experts (router replay)."""
    logits = forward(params, config, tokens, attention_mask=attention_mask, remat=remat, attention=attention, mesh=mesh,
                     lora_dropout=lora_dropout, lora_dropout_rng=lora_dropout_rng, segment_ids=segment_ids,
                     positions=positions, expert_ids=None if routed_experts is None else layer_major(routed_experts))
    return logprobs_of_logits(logits, tokens)


def layer_major(routed_experts: jax.Array) -> jax.Array:
    """Routed ids as a batch holds them [B, T, moe_layers, k] -> as the forward takes them [moe_layers, B, T, k]."""
    return jnp.moveaxis(routed_experts, 2, 0)


def logprobs_of_logits(logits: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``token_logprobs`` from a forward's logits [B, T, V] of ``tokens`` [B, T]."""
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    # Every position gets a target (the last one a placeholder) and only the [B, T] results drop the
    # last column: slicing the [B, T, V] log-probs instead costs a padding copy of them in the backward pass.
    targets = jnp.concatenate([tokens[:, 1:], tokens[:, -1:]], axis=1)
    # A one-hot contraction rather than a gather: its gradient is a dense multiply, where a gather's
    # is a scatter into [B, T, V], which XLA runs slowly on CPU.
    chosen = jnp.einsum("btv,btv->bt", log_probs, jax.nn.one_hot(targets, log_probs.shape[-1], dtype=log_probs.dtype))
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return chosen[:, :-1], entropy[:, :-1]
