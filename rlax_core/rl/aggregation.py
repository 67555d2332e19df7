"""From per-token losses to one scalar: the three aggregation modes, and masked statistics.

With ``mask[i, t] = 1`` for the completion tokens of sequence ``i``, ``n_i = sum_t mask[i, t]``,
``N = sum_i n_i`` and ``S`` the number of sequences with at least one token, a per-token loss
``l[i, t]`` is reduced as:

========================  ======================================  ==========================  ===============
mode                      formula                                 weight of token (i, t)      used by
========================  ======================================  ==========================  ===============
``token_mean``            ``sum_{i,t} l / N``                     ``1 / N``                   DAPO, CISPO
``seq_mean_token_mean``   ``(1/S) sum_i (sum_t l / n_i)``         ``1 / (S * n_i)``           GRPO, GSPO
``seq_sum_norm``          ``(1/S) sum_i (sum_t l / L)``           ``1 / (S * L)``, L constant  Dr. GRPO
========================  ======================================  ==========================  ===============

``token_mean`` weighs every token alike (long sequences count more); ``seq_mean_token_mean`` weighs
every sequence alike (a token of a short sequence counts more); ``seq_sum_norm`` divides by a
constant so that neither length nor batch composition biases a token's weight. Masked tokens have
weight 0 and padding rows (n_i = 0) are not counted in S.
"""

from __future__ import annotations

import jax.numpy as jnp

_TINY = 1e-8  # guards a division by a count that may be 0 (an all-padding batch)


def aggregate(per_token: jnp.ndarray, mask: jnp.ndarray, mode: str, max_length: int = 0) -> jnp.ndarray:
    """Reduce ``per_token`` [B, T] to a scalar under ``mask`` [B, T] as documented above."""
    return jnp.sum(jnp.where(mask > 0, per_token, 0.0) * token_weights(mask, mode, max_length))


def token_weights(mask: jnp.ndarray, mode: str, max_length: int = 0) -> jnp.ndarray:
    """The weight [B, T] each token gets in :func:`aggregate` (they sum to 1 except for ``seq_sum_norm``)."""
    mask = jnp.asarray(mask, jnp.float32)
    lengths = jnp.sum(mask, axis=-1, keepdims=True)  # [B, 1]
    num_sequences = jnp.maximum(jnp.sum(lengths > 0), 1)
    if mode == "token_mean":
        return mask / jnp.maximum(jnp.sum(mask), 1.0)
    if mode == "seq_mean_token_mean":
        return mask / jnp.maximum(lengths, 1.0) / num_sequences
    if mode == "seq_sum_norm":
        if max_length <= 0:
            raise ValueError("seq_sum_norm needs max_length > 0 (the constant that divides each sequence sum)")
        return mask / (max_length * num_sequences)
    raise ValueError(f"unknown aggregation mode {mode!r}; expected token_mean, seq_mean_token_mean or seq_sum_norm")


def masked_mean(values: jnp.ndarray, mask: jnp.ndarray, axis=None) -> jnp.ndarray:
    """Mean of ``values`` where ``mask`` is set (0 where nothing is set)."""
    mask = jnp.asarray(mask, jnp.float32)
    return jnp.sum(jnp.where(mask > 0, values, 0.0), axis=axis) / jnp.maximum(jnp.sum(mask, axis=axis), _TINY)


def masked_std(values: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Population standard deviation of ``values`` where ``mask`` is set."""
    mean = masked_mean(values, mask)
    return jnp.sqrt(masked_mean(jnp.square(values - mean), mask))


def masked_min(values: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Minimum of ``values`` where ``mask`` is set (0 where nothing is set)."""
    found = jnp.min(jnp.where(mask > 0, values, jnp.inf))
    return jnp.where(jnp.isfinite(found), found, 0.0)


def masked_max(values: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Maximum of ``values`` where ``mask`` is set (0 where nothing is set)."""
    return -masked_min(-values, mask)


def masked_whiten(values: jnp.ndarray, mask: jnp.ndarray, eps: float = 1e-6) -> jnp.ndarray:
    """``(values - mean) / (std + eps)`` over the masked entries; masked-out entries become 0."""
    whitened = (values - masked_mean(values, mask)) / (masked_std(values, mask) + eps)
    return whitened * mask


def sequence_mean(values: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """Per-sequence mean over the masked tokens: [B, T] -> [B] (0 for an empty sequence)."""
    return masked_mean(values, mask, axis=-1)
