"""A batch cut into micro-batches and their metrics combined: the shapes of the update's loops.

Micro-batches take strided rows (``split_micro_batches``), so that each keeps rows on every device;
their stacked metrics combine by name (``combine_metrics``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def split_micro_batches(batch: dict[str, jax.Array], num: int) -> dict[str, jax.Array]:
    """[B, ...] -> [num, B / num, ...], micro-batch m holding rows m, m + num, m + 2 num, ...

    Strided rather than contiguous: the rows of a device are contiguous, so each micro-batch keeps
    rows on every device and no device idles.
    """
    return jax.tree.map(lambda x: jnp.swapaxes(x.reshape(x.shape[0] // num, num, *x.shape[1:]), 0, 1), batch)


def join_micro_batches(split: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The inverse of :func:`split_micro_batches`: [num, B / num, ...] -> [B, ...] in the original row order."""
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:]), split)


def combine_metrics(stacked: dict[str, jax.Array], axis=None) -> dict[str, jax.Array]:
    """Stacked metrics -> one value each along ``axis`` (min of mins, max of maxes, sum of counts, else mean)."""
    out = {}
    for name, values in stacked.items():
        if name.endswith("_min"):
            out[name] = jnp.min(values, axis=axis)
        elif name.endswith("_max"):
            out[name] = jnp.max(values, axis=axis)
        elif name.startswith("num_"):
            out[name] = jnp.sum(values, axis=axis)
        else:
            out[name] = jnp.mean(values, axis=axis)
    return out
