"""Advantage estimators, in a registry by name, behind one entry point :func:`compute_advantages`.

Inputs are arrays: one scalar reward per completion ``rewards [B]``, the completion mask
``mask [B, T]`` (1 on generated tokens, 0 on padding), and the group layout: either ``group_ids [B]``
(any integers; equal ids = completions of the same prompt) or rewards shaped ``[num_groups, G]``
(row-major, so completion ``g * G + j`` is sample j of group g). The result is ``[B, T]``
advantages, 0 on masked tokens, on padding rows and on samples GFPO filtered out.

======================  ====================================================================  =====================
name                    advantage of completion i (group g, n_g active samples)               paper
======================  ====================================================================  =====================
grpo                    ``(r_i - mean_g r) / (std_g r + eps)``, std with Bessel's correction  Shao et al. 2024
dr_grpo                 ``r_i - mean_g r``                                                    Liu et al. 2025
rloo                    ``r_i - (sum_g r - r_i) / (n_g - 1)``                                 Ahmadian et al. 2024
reinforce_pp            per-token return-to-go of the (KL-shaped) token rewards, whitened     Hu 2025
                        over all tokens of the batch
reinforce_pp_baseline   as reinforce_pp, with the group mean subtracted from r_i first        Hu 2025
gae                     generalised advantage estimation with a value model (gamma, lambda)   Schulman et al. 2016
======================  ====================================================================  =====================

A group whose active rewards are all equal gets advantage exactly 0 under every group estimator
(no division of rounding noise by a zero standard deviation). With ``kl_in_reward`` the per-token
KL penalty ``-kl_coef * kl[i, t]`` is added to the token rewards (token-level estimators) or its
sum to ``r_i`` (group estimators). ``gamma`` discounts the token-level estimators.

Extend with::

    @register_advantage_estimator("my_estimator")
    def my_estimator(config, batch: AdvantageBatch) -> jnp.ndarray:  # [B, T]
        ...

The public functions are jitted with ``config`` as a static argument (it is frozen and hashable), and
nest inside a caller's jit.
"""

from __future__ import annotations

import functools
import dataclasses
from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp

from rlax_core.rl.aggregation import masked_whiten
from rlax_core.rl.group_filter import group_filter_mask, same_group_matrix
from rlax_core.utils.registry import Registry


@dataclasses.dataclass(frozen=True)
class AdvantageBatch:
    """What an estimator sees; every array is already flattened to ``B`` completions."""

    rewards: jnp.ndarray  # [B] sequence rewards (KL-shaped when kl_in_reward)
    token_rewards: jnp.ndarray  # [B, T] the KL penalties per token plus the raw reward on the last token
    mask: jnp.ndarray  # [B, T] float, already zero on inactive samples
    active: jnp.ndarray  # [B] bool: not padding and kept by the group filter
    same_group: jnp.ndarray  # [B, B] bool: both active and in the same group
    values: Optional[jnp.ndarray]  # [B, T] value-model estimates (GAE) or None


class Estimator(NamedTuple):
    fn: Callable[..., jnp.ndarray]
    needs_values: bool
    needs_groups: bool


ADVANTAGE_ESTIMATORS: Registry = Registry("advantage estimator")  # name -> Estimator


def register_advantage_estimator(name: str, *, needs_values: bool = False, needs_groups: bool = False):
    """Decorator: make ``fn(config, batch: AdvantageBatch) -> [B, T]`` selectable as ``advantage_estimator``."""

    def register(fn):
        held = ADVANTAGE_ESTIMATORS.get(name)
        ADVANTAGE_ESTIMATORS.add(name, held if held is not None and held.fn is fn else Estimator(fn, needs_values,
                                                                                                 needs_groups))
        return fn

    return register


# ----------------------------------------------------------------------------- group statistics


def _group_mean_and_count(batch: AdvantageBatch) -> tuple[jnp.ndarray, jnp.ndarray]:
    same = batch.same_group.astype(jnp.float32)
    count = jnp.sum(same, axis=1)
    return same @ batch.rewards / jnp.maximum(count, 1.0), count


def _group_is_constant(batch: AdvantageBatch) -> jnp.ndarray:
    """[B] bool: every active reward of my group equals mine (exact comparison, no rounding)."""
    differs = batch.same_group & (batch.rewards[None, :] != batch.rewards[:, None])
    return ~jnp.any(differs, axis=1)


def _per_token(advantages: jnp.ndarray, batch: AdvantageBatch) -> jnp.ndarray:
    return advantages[:, None] * batch.mask


@register_advantage_estimator("grpo", needs_groups=True)
def grpo_advantages(config, batch: AdvantageBatch) -> jnp.ndarray:
    """GRPO outcome supervision (DeepSeekMath, Shao et al. 2024, §4.1.2): group-standardised reward."""
    mean, count = _group_mean_and_count(batch)
    sum_sq = jnp.sum(jnp.where(batch.same_group, jnp.square(batch.rewards[None, :] - mean[:, None]), 0.0), axis=1)
    std = jnp.sqrt(sum_sq / jnp.maximum(count - 1.0, 1.0))
    advantages = (batch.rewards - mean) / (std + config.std_eps)
    return _per_token(jnp.where(_group_is_constant(batch), 0.0, advantages), batch)


@register_advantage_estimator("dr_grpo", needs_groups=True)
def dr_grpo_advantages(config, batch: AdvantageBatch) -> jnp.ndarray:
    """Dr. GRPO (Liu et al. 2025, §3.2): the group mean is the baseline; no division by the std."""
    mean, _ = _group_mean_and_count(batch)
    return _per_token(jnp.where(_group_is_constant(batch), 0.0, batch.rewards - mean), batch)


@register_advantage_estimator("rloo", needs_groups=True)
def rloo_advantages(config, batch: AdvantageBatch) -> jnp.ndarray:
    """RLOO (Ahmadian et al. 2024, §3.3; Kool et al. 2019): the mean of the *other* samples is the baseline."""
    mean, count = _group_mean_and_count(batch)
    others = jnp.maximum(count - 1.0, 1.0)
    # r_i - (n mean - r_i) / (n - 1) == n / (n - 1) * (r_i - mean); a lone sample has no baseline: 0.
    advantages = jnp.where(count > 1, count / others * (batch.rewards - mean), 0.0)
    return _per_token(jnp.where(_group_is_constant(batch), 0.0, advantages), batch)


def discounted_returns(token_rewards: jnp.ndarray, mask: jnp.ndarray, gamma: float) -> jnp.ndarray:
    """Return-to-go ``G_t = sum_{s >= t} gamma^(s - t) r_s`` over the masked tokens of each row."""

    def step(future, inputs):
        reward, m = inputs
        ret = reward + gamma * future
        return jnp.where(m > 0, ret, future), jnp.where(m > 0, ret, 0.0)

    _, returns = jax.lax.scan(step, jnp.zeros(token_rewards.shape[0]), (token_rewards.T, mask.T), reverse=True)
    return returns.T


@register_advantage_estimator("reinforce_pp")
def reinforce_pp_advantages(config, batch: AdvantageBatch) -> jnp.ndarray:
    """REINFORCE++ (Hu 2025, §3): token-level returns of the KL-shaped rewards, normalised over the batch."""
    returns = discounted_returns(batch.token_rewards, batch.mask, config.gamma)
    return masked_whiten(returns, batch.mask, config.std_eps)


@register_advantage_estimator("reinforce_pp_baseline", needs_groups=True)
def reinforce_pp_baseline_advantages(config, batch: AdvantageBatch) -> jnp.ndarray:
    """REINFORCE++-baseline (Hu 2025): subtract the group mean reward, then as REINFORCE++."""
    mean, _ = _group_mean_and_count(batch)
    centred = jnp.where(_group_is_constant(batch), 0.0, batch.rewards - mean)
    token_rewards = batch.token_rewards + _on_last_token(centred - batch.rewards, batch.mask)
    returns = discounted_returns(token_rewards, batch.mask, config.gamma)
    return masked_whiten(returns, batch.mask, config.std_eps)


def gae(token_rewards, values, mask, gamma: float, lam: float) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16) over the masked tokens.

    Returns ``(advantages, returns)``, both [B, T] and 0 on masked tokens; ``returns = advantages +
    values`` are the value model's regression targets. The value after a sequence's last token is 0
    (the episode ends); masked tokens inside a row are skipped, not treated as an end.
    """

    def step(carry, inputs):
        next_value, next_advantage = carry
        reward, value, m = inputs
        delta = reward + gamma * next_value - value
        advantage = delta + gamma * lam * next_advantage
        carry = (jnp.where(m > 0, value, next_value), jnp.where(m > 0, advantage, next_advantage))
        return carry, jnp.where(m > 0, advantage, 0.0)

    zeros = jnp.zeros(token_rewards.shape[0], dtype=jnp.float32)
    _, advantages = jax.lax.scan(step, (zeros, zeros), (token_rewards.T, values.T, mask.T), reverse=True)
    advantages = advantages.T
    return advantages, (advantages + values) * mask


@register_advantage_estimator("gae", needs_values=True)
def gae_advantages(config, batch: AdvantageBatch) -> jnp.ndarray:
    """PPO's advantages from a value model (Schulman et al. 2017, §5), optionally whitened over the batch."""
    advantages, _ = gae(batch.token_rewards, batch.values, batch.mask, config.gamma, config.gae_lambda)
    if config.whiten_advantages:
        advantages = masked_whiten(advantages, batch.mask, config.std_eps)
    return advantages


# ----------------------------------------------------------------------------- the entry point


def _on_last_token(per_sequence: jnp.ndarray, mask: jnp.ndarray) -> jnp.ndarray:
    """[B] -> [B, T]: the value placed on each row's last masked token, 0 elsewhere."""
    positions = jnp.arange(mask.shape[1])
    last = jnp.max(jnp.where(mask > 0, positions, -1), axis=1)
    return jnp.where(positions[None, :] == last[:, None], per_sequence[:, None], 0.0)


def _flatten_layout(rewards, mask, group_ids, values, kl):
    """Accept rewards [B] + group_ids [B], or rewards [num_groups, G] (+ arrays with [num_groups, G, ...])."""
    rewards = jnp.asarray(rewards, jnp.float32)
    if rewards.ndim == 2:
        if group_ids is not None:
            raise ValueError("pass either group_ids or rewards shaped [num_groups, G], not both")
        num_groups, group_size = rewards.shape
        group_ids = jnp.repeat(jnp.arange(num_groups), group_size)
        # Arrays given as [num_groups, G, T] are flattened; [B, T] ones are checked below.
        flat = lambda x: x if x is None or jnp.ndim(x) != 3 else jnp.reshape(x, (num_groups * group_size,) + x.shape[-1:])
        rewards, mask, values, kl = rewards.reshape(-1), flat(mask), flat(values), flat(kl)
    elif rewards.ndim != 1:
        raise ValueError(f"rewards must be [B] or [num_groups, G], got shape {rewards.shape}")
    if mask.ndim != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"mask must be [B, T] with B = {rewards.shape[0]} completions, got shape {mask.shape}")
    return rewards, mask, group_ids, values, kl


@functools.partial(jax.jit, static_argnums=0)
def compute_advantages(
    config,
    rewards: jnp.ndarray,
    mask: jnp.ndarray,
    *,
    group_ids: Optional[jnp.ndarray] = None,
    values: Optional[jnp.ndarray] = None,
    kl: Optional[jnp.ndarray] = None,
    sample_mask: Optional[jnp.ndarray] = None,
) -> jnp.ndarray:
    """Advantages [B, T] for ``config.advantage_estimator`` (see the module docstring).

    Args:
      config: an ``AlgorithmConfig`` (static under jit).
      rewards: [B] with ``group_ids`` [B], or [num_groups, G].
      mask: [B, T] (or [num_groups, G, T]) completion mask; rows that are all 0 are padding.
      values: [B, T] value estimates, for ``gae``.
      kl: [B, T] per-token KL to the reference (``kl_estimate(old_logprobs, ref_logprobs, ...)``), needed
        when ``config.kl_in_reward`` and ``kl_coef > 0``.
      sample_mask: [B] optional; 0 marks completions to leave out (padding rows in a fixed-size batch).
    """
    estimator = ADVANTAGE_ESTIMATORS[config.advantage_estimator]
    rewards, mask, group_ids, values, kl = _flatten_layout(rewards, mask, group_ids, values, kl)
    if estimator.needs_groups and group_ids is None:
        raise ValueError(f"{config.advantage_estimator} needs groups: pass group_ids [B] or rewards [num_groups, G]")
    if config.group_filter != "none" and group_ids is None:
        raise ValueError("group_filter needs groups: pass group_ids [B] or rewards [num_groups, G]")
    if estimator.needs_values and values is None:
        raise ValueError(f"{config.advantage_estimator} needs values [B, T] from a value model")
    shaping = config.kl_in_reward and config.kl_coef > 0
    if shaping and kl is None:
        raise ValueError("kl_in_reward with kl_coef > 0 needs kl [B, T] (per-token KL to the reference)")

    mask = jnp.asarray(mask, jnp.float32)
    group_ids = jnp.zeros(rewards.shape, jnp.int32) if group_ids is None else jnp.asarray(group_ids)
    active = _trained(config, rewards, mask, group_ids, sample_mask)
    mask = mask * active[:, None]
    kl, values = (None if x is None else jnp.where(mask > 0, jnp.asarray(x, jnp.float32), 0.0) for x in (kl, values))

    kl_penalty = config.kl_coef * kl * mask if shaping else jnp.zeros_like(mask)
    batch = AdvantageBatch(
        rewards=rewards - jnp.sum(kl_penalty, axis=1),
        token_rewards=_on_last_token(rewards, mask) - kl_penalty,
        mask=mask,
        active=active,
        same_group=same_group_matrix(group_ids, active),
        values=None if values is None else jnp.asarray(values, jnp.float32),
    )
    return estimator.fn(config, batch) * mask


def _trained(config, rewards, mask, group_ids, sample_mask) -> jnp.ndarray:
    """[B] bool: the completions the objective learns from (not padding, not left out, kept by GFPO's filter)."""
    lengths = jnp.sum(mask, axis=1)
    active = lengths > 0
    if sample_mask is not None:
        active = active & (jnp.asarray(sample_mask) > 0)
    if config.group_filter != "none":
        active = group_filter_mask(config.group_filter, config.group_filter_keep, rewards, lengths, group_ids, active)
    return active


@functools.partial(jax.jit, static_argnums=0)
def trained_mask(config, rewards: jnp.ndarray, mask: jnp.ndarray, *, group_ids: Optional[jnp.ndarray] = None,
                 sample_mask: Optional[jnp.ndarray] = None) -> jnp.ndarray:
    """``mask`` [B, T] (flattened like :func:`compute_advantages`'s result) on the completions trained on.

    GFPO (Shrivastava et al. 2025, eq. 3) sums its objective over the retained subset S of each group
    and normalises by ``sum_{i in S} |o_i|``: a filtered-out completion adds no policy-gradient, KL or
    entropy term and no token to any count. The loss takes this mask, not the completion mask, so that
    every ``loss_aggregation`` divides by the retained completions' tokens (or sequences) only.
    """
    rewards, mask, group_ids, _, _ = _flatten_layout(rewards, mask, group_ids, None, None)
    mask = jnp.asarray(mask, jnp.float32)
    if config.group_filter != "none" and group_ids is None:
        raise ValueError("group_filter needs groups: pass group_ids [B] or rewards [num_groups, G]")
    group_ids = jnp.zeros(rewards.shape, jnp.int32) if group_ids is None else jnp.asarray(group_ids)
    return mask * _trained(config, rewards, mask, group_ids, sample_mask)[:, None]


@functools.partial(jax.jit, static_argnums=0)
def value_targets(config, rewards, mask, values, *, kl=None, group_ids=None) -> jnp.ndarray:
    """GAE returns [B, T] (advantages + values, before any whitening): the targets of :func:`value_loss`."""
    rewards, mask, _, values, kl = _flatten_layout(rewards, mask, group_ids, values, kl)
    mask = jnp.asarray(mask, jnp.float32)
    shaping = config.kl_in_reward and config.kl_coef > 0
    if shaping and kl is None:
        raise ValueError("kl_in_reward with kl_coef > 0 needs kl [B, T] (per-token KL to the reference)")
    kl, values = (None if x is None else jnp.where(mask > 0, jnp.asarray(x, jnp.float32), 0.0) for x in (kl, values))
    kl_penalty = config.kl_coef * kl * mask if shaping else 0.0
    token_rewards = _on_last_token(jnp.asarray(rewards, jnp.float32), mask) - kl_penalty
    _, returns = gae(token_rewards, values, mask, config.gamma, config.gae_lambda)
    return returns
