"""Context parallelism: each row's tokens split over the mesh's ``context`` axis.

A row of T tokens on C chips: every token-wise part of a layer (norms, projections, the MLP, the
logits) runs on the chip's T / C tokens with no communication; attention gathers the keys and
values of the whole row over ``context`` (``all_gather``) and each chip attends its own queries
against them. This is the all-gather form of context parallelism (MaxText's, Llama 3's) rather
than ring attention: one collective per layer whose keys and values are the small side of GQA
(8 KV heads against 40 query heads in QwQ-32B), overlappable with the projections, and the same
attention math as one chip's.

**Causal load balance.** Under a causal mask the last tokens see the most keys; split in order, the
last chip would do C times the first one's attention. The row is cut into 2C chunks and chip c holds
chunks c and 2C - 1 - c (``balanced_order``), so every chip has one early and one late chunk and the
same work. The tokens are permuted once before the first layer and the outputs back after the last;
positions (RoPE) and the causal mask read each token's place in the row, not its place on the chip.

The chunk's attention is the dense path (``attention.masked_attention``): [heads, T / C, T] scores
per chip, on every platform. A flash kernel per chunk (splash with an offset causal mask) is the
next step for rows long enough that those scores outgrow a chip.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlax_core.models.attention import masked_attention, row_axes


def balanced_order(steps: int, shards: int) -> np.ndarray:
    """The row's token order on ``shards`` chips, chip c's T / C tokens contiguous: chunks c and
    2C - 1 - c of 2C (see the module docstring)."""
    if steps % (2 * shards):
        raise ValueError(f"context parallelism over {shards} chips needs rows of a multiple of {2 * shards} "
                         f"tokens, not {steps}")
    chunk = steps // (2 * shards)
    chunks = [c for shard in range(shards) for c in (shard, 2 * shards - 1 - shard)]
    return np.concatenate([np.arange(c * chunk, (c + 1) * chunk) for c in chunks])


def context_shards(mesh: Mesh | None) -> int:
    return 1 if mesh is None or "context" not in mesh.shape else mesh.shape["context"]


def shard_tokens(x: jax.Array, mesh: Mesh) -> jax.Array:
    """[B, T, ...] placed with its rows over the batch axes and its tokens over ``context``."""
    spec = PartitionSpec(row_axes(mesh, x.shape[0]) or None, "context", *([None] * (x.ndim - 2)))
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))


def context_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, token_index: jax.Array,
                      mesh: Mesh) -> jax.Array:
    """Causal attention of rows whose tokens are split over ``context`` in ``balanced_order``.

    q [B, T, Hq, D], k and v [B, T, Hkv, D], ``segment_ids`` [B, T] (0 padding, as in
    ``attention.causal_attention``), ``token_index`` [T] each token's place in the row. Returns
    [B, T, Hq, D] in v's dtype, in the same (permuted) order.
    """
    batch_axes = row_axes(mesh, q.shape[0]) or None
    heads = "tensor" if mesh.shape["tensor"] > 1 and k.shape[2] % mesh.shape["tensor"] == 0 else None
    qkv = PartitionSpec(batch_axes, "context", heads, None)

    def chunk(q, k, v, segments, index):
        gather = lambda x: jax.lax.all_gather(x, "context", axis=1 if x.ndim > 1 else 0, tiled=True)
        keys, values, key_segments, key_index = gather(k), gather(v), gather(segments), gather(index)
        mask = (key_index[None, None, :] <= index[None, :, None]) & (segments[:, :, None] == key_segments[:, None, :])
        return masked_attention(q, keys, values, mask)

    return jax.shard_map(chunk, mesh=mesh,
                         in_specs=(qkv, qkv, qkv, PartitionSpec(batch_axes, "context"), PartitionSpec("context")),
                         out_specs=qkv, check_vma=False)(q, k, v, segment_ids, token_index)
