"""GFPO's group filtering (Shrivastava et al. 2025, "Sample More to Think Less", arXiv 2508.09726, §3).

Sample a larger group of G completions per prompt, rank them by a desired attribute, and learn only
from the best k: the others keep their place in the batch (shapes stay static under jit) but get
advantage 0, and the group statistics of the advantage estimator are taken over the k kept ones.

Attributes: ``length`` (shorter is better) and ``reward_per_token`` (reward / length, higher is
better: "token efficiency"). Ties go to the sample that comes first in the batch, so the choice is
deterministic.
"""

from __future__ import annotations

import jax.numpy as jnp


def same_group_matrix(group_ids: jnp.ndarray, active: jnp.ndarray) -> jnp.ndarray:
    """``[B, B]`` bool: samples i and j belong to the same group and both are active."""
    same = group_ids[:, None] == group_ids[None, :]
    return same & active[:, None] & active[None, :]


def keep_best_k(scores: jnp.ndarray, group_ids: jnp.ndarray, active: jnp.ndarray, k: int) -> jnp.ndarray:
    """``[B]`` bool: each active sample whose score ranks among the ``k`` highest of its group."""
    index = jnp.arange(scores.shape[0])
    beats = (scores[None, :] > scores[:, None]) | ((scores[None, :] == scores[:, None]) & (index[None, :] < index[:, None]))
    rank = jnp.sum(beats & same_group_matrix(group_ids, active), axis=1)  # how many group mates rank above me
    return active & (rank < k)


def group_filter_mask(
    criterion: str, keep: int, rewards: jnp.ndarray, lengths: jnp.ndarray, group_ids: jnp.ndarray, active: jnp.ndarray
) -> jnp.ndarray:
    """The samples GFPO trains on: the best ``keep`` of each group by ``criterion``."""
    lengths = lengths.astype(jnp.float32)
    if criterion == "length":
        scores = -lengths
    elif criterion == "reward_per_token":
        scores = rewards / jnp.maximum(lengths, 1.0)
    else:
        raise ValueError(f"unknown group filter {criterion!r}; expected 'length' or 'reward_per_token'")
    return keep_best_k(scores, group_ids, active, keep)
