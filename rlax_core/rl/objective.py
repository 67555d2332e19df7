"""The policy objective: one loss, parameterised by ``AlgorithmConfig``; and PPO's value loss.

Per token (i, t) of a completion, with ``A`` the advantage and ``r = pi / pi_old`` the importance ratio
(per token, or GSPO's per-sequence geometric mean ``exp(mean_t log r)`` shared by every token)::

    clipped:  l = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))        PPO / DAPO clip-higher
              l = min(l, -c A)  where A < 0                                dual-clip (c > 1)
    cispo:    l = -sg(clip(r, 1 - eps_low, 1 + eps_high)) A log pi         CISPO (sg = stop-gradient)

    l <- w * l                    training-inference mismatch weight w (TIS / MIS, a constant)
    l <- l + kl_coef * KL_t       KL to the reference (k1 / k2 / k3), unless kl_in_reward
    l <- l - entropy_coef * H_t   entropy bonus

and the loss is ``aggregate(l, mask, loss_aggregation)`` (see ``aggregation``). The mismatch weight
compares the trainer's old log-probs with the engine's behaviour log-probs ``rho = pi_old / mu``:
TIS uses ``min(rho, mismatch_high)``; MIS (icepop) uses ``rho`` inside
``[mismatch_low, mismatch_high]`` and masks the token (w = 0) outside it. At sequence level ``rho``
is the length-normalised geometric mean over the sequence (one threshold fits every length).

In the training graph the trainer passes ``old_logprobs = stop_gradient(logprobs)`` when it has
taken no step since sampling: then ``r`` is exactly 1.0 and every preset's gradient equals the
on-policy REINFORCE gradient ``grad aggregate(-A log pi)`` (plus its regularisers).

Typical use in a train step::

    loss, metrics = policy_loss(config, logprobs, old_logprobs, advantages, mask,
                                ref_logprobs=ref, behavior_logprobs=batch["behavior_logprobs"],
                                entropy=entropy)

``policy_loss`` and ``value_loss`` are jitted with ``config`` static (they nest inside the train step's
jit); metrics are stop-gradient scalars.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from rlax_core.rl.aggregation import aggregate, masked_max, masked_mean, masked_min, masked_std, sequence_mean
from rlax_core.rl.kl import kl_estimate

# exp() of a log-ratio beyond this overflows float32 long before it means anything; clipping and
# the mismatch thresholds act far inside this range.
_MAX_LOG_RATIO = 20.0


def log_importance_ratio(logprobs, old_logprobs, mask, level: str = "token") -> jnp.ndarray:
    """log(pi / pi_old) [B, T]: per token, or per sequence (the masked mean, broadcast to its tokens)."""
    log_ratio = (logprobs - old_logprobs) * mask
    if level == "sequence":
        log_ratio = sequence_mean(log_ratio, mask)[:, None] * mask
    elif level != "token":
        raise ValueError(f"unknown importance-ratio level {level!r}; expected 'token' or 'sequence'")
    return jnp.clip(log_ratio, -_MAX_LOG_RATIO, _MAX_LOG_RATIO)


def mismatch_weights(config, old_logprobs, behavior_logprobs, mask) -> tuple[jnp.ndarray, dict]:
    """The TIS / MIS weight [B, T] between the trainer's old policy and the engine, and its metrics."""
    log_rho = jax.lax.stop_gradient(log_importance_ratio(old_logprobs, behavior_logprobs, mask, config.mismatch_level))
    rho = jnp.exp(log_rho)
    if config.mismatch_correction == "tis":
        weights = jnp.minimum(rho, config.mismatch_high)
        corrected = rho > config.mismatch_high
    elif config.mismatch_correction == "mis":
        inside = (rho >= config.mismatch_low) & (rho <= config.mismatch_high)
        weights = jnp.where(inside, rho, 0.0)
        corrected = ~inside
    else:
        weights, corrected = jnp.ones_like(rho), jnp.zeros(rho.shape, bool)
    metrics = {
        "mismatch_kl": masked_mean(kl_estimate(behavior_logprobs, old_logprobs, "k3"), mask),
        "mismatch_weight_mean": masked_mean(weights, mask),
        "mismatch_corrected_frac": masked_mean(corrected, mask),
    }
    return weights, metrics


@functools.partial(jax.jit, static_argnums=0)
def policy_loss(
    config,
    logprobs: jnp.ndarray,
    old_logprobs: jnp.ndarray,
    advantages: jnp.ndarray,
    mask: jnp.ndarray,
    *,
    ref_logprobs: Optional[jnp.ndarray] = None,
    behavior_logprobs: Optional[jnp.ndarray] = None,
    entropy: Optional[jnp.ndarray] = None,
) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """The policy loss of ``config`` and its metrics (see the module docstring).

    Args:
      logprobs: [B, T] log pi(token) of the current policy (differentiable).
      old_logprobs: [B, T] of the policy before this optimisation phase (constant).
      advantages: [B, T], or [B] for one advantage per sequence.
      mask: [B, T] 1 on completion tokens, 0 on prompt and padding.
      ref_logprobs: [B, T] of the reference policy; needed when kl_coef > 0 and the KL is in the loss.
      behavior_logprobs: [B, T] the inference engine's log-probs of the sampled tokens; needed by a
        mismatch correction, and used for the ``mismatch_kl`` metric when given.
      entropy: [B, T] per-token entropy of the current policy; needed when entropy_coef > 0 (then it
        must be differentiable) and logged when given.
    """
    mask = jnp.asarray(mask, jnp.float32)
    advantages = jnp.asarray(advantages, jnp.float32)
    if advantages.ndim == 1:
        advantages = advantages[:, None]
    advantages = jnp.broadcast_to(advantages, mask.shape)
    # Padding may hold anything (even inf); zero it first so that neither the loss nor its gradient
    # can pick up a 0 * inf from a masked position.
    logprobs, old_logprobs, advantages, ref_logprobs, behavior_logprobs, entropy = (
        None if x is None else jnp.where(mask > 0, x, 0.0)
        for x in (logprobs, old_logprobs, advantages, ref_logprobs, behavior_logprobs, entropy)
    )
    kl_in_loss = config.kl_coef > 0 and not config.kl_in_reward
    if kl_in_loss and ref_logprobs is None:
        raise ValueError(f"{config.name}: kl_coef > 0 with the KL in the loss needs ref_logprobs")
    if config.entropy_coef > 0 and entropy is None:
        raise ValueError(f"{config.name}: entropy_coef > 0 needs the per-token entropy")
    if config.mismatch_correction != "none" and behavior_logprobs is None:
        raise ValueError(f"{config.name}: mismatch_correction={config.mismatch_correction!r} needs behavior_logprobs")

    log_ratio = log_importance_ratio(logprobs, old_logprobs, mask, config.importance_ratio)
    ratio = jnp.exp(log_ratio)
    low, high = 1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high
    stats = {}
    if config.policy_loss == "clipped":
        per_token = jnp.maximum(-advantages * ratio, -advantages * jnp.clip(ratio, low, high))
        stats["clip_frac_low"] = masked_mean((advantages < 0) & (ratio < low), mask)
        stats["clip_frac_high"] = masked_mean((advantages > 0) & (ratio > high), mask)
        if config.dual_clip_c is not None:
            bound = -config.dual_clip_c * advantages
            stats["dual_clip_frac"] = masked_mean((advantages < 0) & (per_token > bound), mask)
            per_token = jnp.where(advantages < 0, jnp.minimum(per_token, bound), per_token)
    elif config.policy_loss == "cispo":
        weight = jax.lax.stop_gradient(jnp.clip(ratio, low, high))
        per_token = -weight * advantages * logprobs
        stats["clip_frac_low"] = masked_mean(ratio < low, mask)
        stats["clip_frac_high"] = masked_mean(ratio > high, mask)
    else:
        raise ValueError(f"unknown policy_loss {config.policy_loss!r}")

    if behavior_logprobs is not None:
        weights, mismatch_stats = mismatch_weights(config, old_logprobs, behavior_logprobs, mask)
        per_token = per_token * weights
        stats.update(mismatch_stats)
    stats["pg_loss"] = aggregate(per_token, mask, config.loss_aggregation, config.loss_max_length)

    if ref_logprobs is not None:
        kl = kl_estimate(logprobs, ref_logprobs, config.kl_estimator)
        stats["kl_ref"] = masked_mean(kl, mask)
        if kl_in_loss:
            per_token = per_token + config.kl_coef * kl
    if entropy is not None:
        stats["entropy"] = masked_mean(entropy, mask)
        if config.entropy_coef > 0:
            per_token = per_token - config.entropy_coef * entropy

    loss = aggregate(per_token, mask, config.loss_aggregation, config.loss_max_length)
    stats.update(
        {
            "approx_kl_old": masked_mean(kl_estimate(old_logprobs, logprobs, "k3"), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_min": masked_min(ratio, mask),
            "ratio_max": masked_max(ratio, mask),
            "advantage_mean": masked_mean(advantages, mask),
            "advantage_std": masked_std(advantages, mask),
            "advantage_min": masked_min(advantages, mask),
            "advantage_max": masked_max(advantages, mask),
            "num_tokens": jnp.sum(mask),
        }
    )
    return loss, jax.lax.stop_gradient(stats)


@functools.partial(jax.jit, static_argnums=0)
def value_loss(config, values, old_values, returns, mask) -> tuple[jnp.ndarray, dict[str, jnp.ndarray]]:
    """PPO's value loss ``0.5 (V - R)^2``, clipped around the old values when ``value_clip_eps`` is set.

    ``returns`` are the GAE targets (``advantages.value_targets``); tokens are weighed by
    ``loss_aggregation`` like the policy loss.
    """
    mask = jnp.asarray(mask, jnp.float32)
    values, old_values, returns = (jnp.where(mask > 0, x, 0.0) for x in (values, old_values, returns))
    loss_per_token = 0.5 * jnp.square(values - returns)
    stats = {}
    if config.value_clip_eps is not None:
        clipped = old_values + jnp.clip(values - old_values, -config.value_clip_eps, config.value_clip_eps)
        clipped_loss = 0.5 * jnp.square(clipped - returns)
        # Counted only where the clip moved the value: inside the range, old + (V - old) may differ
        # from V by a rounding error, which must not read as clipping.
        moved = jnp.abs(values - old_values) > config.value_clip_eps
        stats["value_clip_frac"] = masked_mean((clipped_loss > loss_per_token) & moved, mask)
        loss_per_token = jnp.maximum(loss_per_token, clipped_loss)
    loss = aggregate(loss_per_token, mask, config.loss_aggregation, config.loss_max_length)
    residual_var = masked_mean(jnp.square(returns - values - masked_mean(returns - values, mask)), mask)
    stats["value_explained_variance"] = 1.0 - residual_var / jnp.maximum(jnp.square(masked_std(returns, mask)), 1e-8)
    stats["value_mean"] = masked_mean(values, mask)
    return loss, jax.lax.stop_gradient(stats)
