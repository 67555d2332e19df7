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

**Each chunk's attention.** Dense (``attention.masked_attention``): [heads, T / C, T] scores per chip,
the CPU's path. Splash (``attention.splash_attention``, the trainer's TPU path): no scores are kept,
and each of the chip's two chunks is one kernel call over the gathered keys. A splash mask is fixed
when the kernel is built, but which chunks a chip holds is known only inside the program (its index
on ``context``); so the keys are turned to each chunk: put in row order, then rotated so that the
chunk's own keys end the row ([chunks j+1 .. 2C-1, chunks 0 .. j] for chunk j). One causal mask
offset to the row's end then serves every chunk of every chip, and the keys after the chunk (now at
the front) get a segment id no query has (-1), so none sees them. The kernel skips only the blocks its
fixed mask rules out, so each chip computes the [T / C, T] products the dense path does (as ring
attention without its causal skipping), but in flash blocks: memory per chip no longer grows with T
squared. Chunks of fewer than 128 tokens (the TPU's lane width) run dense.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rlax_core.models.attention import AttentionImpl, fits, masked_attention, row_axes, splash_attention


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
                      mesh: Mesh, impl: AttentionImpl = "dense", interpret: bool = False) -> jax.Array:
    """Causal attention of rows whose tokens are split over ``context`` in ``balanced_order``.

    q [B, T, Hq, D], k and v [B, T, Hkv, D], ``segment_ids`` [B, T] (0 padding, as in
    ``attention.causal_attention``), ``token_index`` [T] each token's place in the row. ``impl``:
    "splash" runs each chunk's attention in the splash kernel (``interpret``: on the CPU), any
    other the dense path (see the module docstring). Returns [B, T, Hq, D] in v's dtype, in the same
    (permuted) order.
    """
    batch_axes = row_axes(mesh, q.shape[0]) or None
    heads = "tensor" if mesh.shape["tensor"] > 1 and k.shape[2] % mesh.shape["tensor"] == 0 else None
    qkv = PartitionSpec(batch_axes, "context", heads, None)
    steps, shards = q.shape[1], mesh.shape["context"]
    width = steps // (2 * shards)  # tokens per chunk
    # Where each token of the row (in row order) lies among the gathered keys (balanced order).
    row_order = np.argsort(balanced_order(steps, shards))

    def chunk(q, k, v, segments, index):
        gather = lambda x: jax.lax.all_gather(x, "context", axis=1 if x.ndim > 1 else 0, tiled=True)
        keys, values, key_segments, key_index = gather(k), gather(v), gather(segments), gather(index)
        if impl != "splash" or not fits("splash", width):
            mask = (key_index[None, None, :] <= index[None, :, None]) & (segments[:, :, None] == key_segments[:, None, :])
            return masked_attention(q, keys, values, mask)
        keys, values, key_segments = keys[:, row_order], values[:, row_order], key_segments[:, row_order]
        shard = jax.lax.axis_index("context")
        outputs = []
        for half, which in enumerate((shard, 2 * shards - 1 - shard)):  # chunk ``which`` of the row
            visible = (which + 1) * width  # keys up to the chunk's end
            turn = lambda x: jax.lax.dynamic_slice_in_dim(jnp.concatenate([x, x], axis=1), visible, steps, axis=1)  # noqa: E731
            seen = jnp.where(jnp.arange(steps) >= steps - visible, turn(key_segments), -1)
            mine = slice(half * width, (half + 1) * width)
            outputs.append(splash_attention(q[:, mine], turn(keys), turn(values), segments[:, mine], seen,
                                            interpret=interpret))
        return jnp.concatenate(outputs, axis=1)

    return jax.shard_map(chunk, mesh=mesh,
                         in_specs=(qkv, qkv, qkv, PartitionSpec(batch_axes, "context"), PartitionSpec("context")),
                         out_specs=qkv, check_vma=False)(q, k, v, segment_ids, token_index)
