"""Causal self-attention over whole rows, by the implementation the hardware has.

    impl = attention_for_platform(mesh.devices.flat[0].platform)    # "splash" | "cudnn" | "dense"
    out = causal_attention(q, k, v, segment_ids, impl=impl, mesh=mesh)

q [B, T, Hq, D], k and v [B, T, Hkv, D] (GQA: each KV head serves Hq / Hkv query heads);
``segment_ids`` [B, T] int32: token i sees token j <= i of the same segment, 0 marking padding
(left or right) and 1, 2, ... the sequences packed into a row. The output of a padding query is
unspecified (no loss reads it); every real query's output is the softmax average of what it sees.

- ``"dense"``: ``transformer.masked_attention``, XLA's [B, H, T, T] float32 scores (the CPU path).
- ``"splash"``: JAX's Pallas TPU splash attention (``jax.experimental.pallas.ops.tpu.splash_attention``),
  flash-style blocks in VMEM and the causal mask's empty blocks skipped, forward and backward; one
  MQA kernel per KV head serves its query-head group without repeating K and V. A Pallas kernel is
  not partitioned by XLA, so on a mesh it runs under ``shard_map``: rows over the batch axes, heads
  over ``tensor`` where it divides the KV heads.
- ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")`` (cuDNN's fused attention)
  with the same-segment mask (the GPU path). JAX's partitioner for it wants q, k and v sharded
  alike, which a GQA model's projections are not (its fewer KV heads shard differently from the
  query heads, and under FSDP XLA places each as it likes): on a mesh it runs under ``shard_map``
  too, each device attending over its own rows and heads, as splash does.

``interpret=True`` runs the splash kernel on CPU, and the cuDNN call as XLA's implementation of the
same call (tests compare both with the dense path there).
"""

from __future__ import annotations

import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from rlax_core.parallel.mesh import BATCH_AXES

AttentionImpl = Literal["dense", "splash", "cudnn"]
IMPLS = ("dense", "splash", "cudnn")
_SPLASH_BLOCK = 512  # query and key tokens per kernel block, at most (a divisor of the row length)
_SPLASH_MIN_BLOCK = 128  # the TPU's lane width: rows must be a multiple of it


def attention_for_platform(platform: str) -> AttentionImpl:
    """Splash on TPU, cuDNN on GPU, dense XLA elsewhere (the CPU)."""
    return {"tpu": "splash", "gpu": "cudnn"}.get(platform, "dense")


def fits(impl: AttentionImpl, steps: int) -> bool:
    """Whether ``impl`` takes rows of ``steps`` tokens: splash tiles rows by the TPU's 128 lanes."""
    return impl != "splash" or steps % _SPLASH_MIN_BLOCK == 0


def same_segment_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, T, T]: query i sees key j when j <= i and both lie in the same segment."""
    steps = segment_ids.shape[1]
    causal = jnp.tril(jnp.ones((steps, steps), bool))
    return causal[None] & (segment_ids[:, :, None] == segment_ids[:, None, :])


def masked_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Softmax attention with grouped KV heads. q [B,T,H,D], k/v [B,S,K,D], mask [B,T,S] (True = see).

    Scores and softmax in float32. Masked scores get the most negative float instead of -inf, so a
    query that sees nothing (a padding row) gives a finite average instead of NaN.
    """
    batch, steps, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[2]
    group = num_heads // num_kv_heads
    # KV-head-major operands ([B, K, G*T, D] queries, [B, K, S, D] keys and values): the two products
    # are then plain batched matmuls whose [.., T, S] results need no transposing copies (on CPU those
    # copies of the largest tensor cost more than the products).
    q = q.reshape(batch, steps, num_kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)
    q = q.reshape(batch, num_kv_heads, group * steps, head_dim)
    v_heads = v.transpose(0, 2, 1, 3)
    # Keys enter as a copy laid out [B, K, D, S]. Left to itself XLA folds the transpose into the score
    # product, and the backward pass's key gradient (dS^T q, contracted over the queries) becomes a
    # transposed batched product that XLA:CPU runs at a third of the speed of the plain one it runs here.
    keys = jax.lax.optimization_barrier(k.transpose(0, 2, 3, 1))
    scores = jnp.einsum("bkqd,bkds->bkqs", q, keys, preferred_element_type=jnp.float32) * head_dim**-0.5
    scores = scores.reshape(batch, num_kv_heads, group, steps, -1)
    scores = jnp.where(mask[:, None, None, :, :], scores, jnp.finfo(jnp.float32).min)
    # Softmax normalised after the value product: dividing the [.., T, D] output rather than the
    # [.., T, S] probabilities saves a pass over the scores, forward and backward. The max is a shift
    # the result does not depend on, so no gradient flows through it.
    weights = jnp.exp(scores - jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True)))
    totals = jnp.sum(weights, axis=-1).reshape(batch, num_kv_heads, group * steps, 1)
    out = jnp.einsum("bkqs,bksd->bkqd", weights.reshape(batch, num_kv_heads, group * steps, -1).astype(v.dtype),
                     v_heads, preferred_element_type=jnp.float32) / totals
    out = out.reshape(batch, num_kv_heads, group, steps, head_dim).transpose(0, 3, 1, 2, 4)
    return out.reshape(batch, steps, num_heads, head_dim).astype(v.dtype)


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, segment_ids: jax.Array, *,
                     impl: AttentionImpl = "dense", mesh: Mesh | None = None, interpret: bool = False) -> jax.Array:
    """See the module docstring. Returns [B, T, Hq, D] in v's dtype."""
    if impl == "dense":
        return masked_attention(q, k, v, same_segment_mask(segment_ids))
    if impl not in IMPLS:
        raise ValueError(f"unknown attention implementation {impl!r}; expected one of {IMPLS}")
    if not fits(impl, q.shape[1]):
        raise ValueError(f"splash attention needs rows of a multiple of {_SPLASH_MIN_BLOCK} tokens, not {q.shape[1]}")
    kernel = functools.partial(_self_splash if impl == "splash" else _cudnn, interpret=interpret)
    if mesh is None:
        return kernel(q, k, v, segment_ids)
    batch_axes = row_axes(mesh, q.shape[0])
    heads = "tensor" if k.shape[2] % mesh.shape["tensor"] == 0 and mesh.shape["tensor"] > 1 else None
    qkv = PartitionSpec(batch_axes or None, None, heads, None)
    return jax.shard_map(kernel, mesh=mesh, in_specs=(qkv, qkv, qkv, PartitionSpec(batch_axes or None, None)),
                         out_specs=qkv, check_vma=False)(q, k, v, segment_ids)


def row_axes(mesh: Mesh, rows: int) -> tuple[str, ...]:
    """The batch axes of ``mesh`` whose product divides ``rows``: what a kernel's rows split over."""
    axes, shards = (), 1
    for axis in BATCH_AXES:
        if mesh.shape[axis] > 1 and rows % (shards * mesh.shape[axis]) == 0:
            axes, shards = axes + (axis,), shards * mesh.shape[axis]
    return axes


def _cudnn(q, k, v, segment_ids, *, interpret: bool):
    mask = same_segment_mask(segment_ids)[:, None]
    return jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True, scale=q.shape[-1] ** -0.5,
                                        implementation="xla" if interpret else "cudnn").astype(v.dtype)


def _block(steps: int) -> int:
    return max(b for b in range(_SPLASH_MIN_BLOCK, min(steps, _SPLASH_BLOCK) + 1, _SPLASH_MIN_BLOCK) if steps % b == 0)


def _self_splash(q, k, v, segment_ids, *, interpret: bool):
    return splash_attention(q, k, v, segment_ids, segment_ids, interpret=interpret)


def splash_attention(q, k, v, q_segment_ids, kv_segment_ids, *, interpret: bool = False) -> jax.Array:
    """The splash kernel on one device: q [B, Tq, Hq, D] the last Tq of the Tkv tokens of k and v
    [B, Tkv, Hkv, D] (query i sees keys j <= Tkv - Tq + i), of the same segment: ``q_segment_ids``
    [B, Tq], ``kv_segment_ids`` [B, Tkv] (a key of a segment no query has, e.g. -1, is seen by none).
    Both lengths a multiple of 128. Returns [B, Tq, Hq, D] in v's dtype."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    batch, steps, num_heads, head_dim = q.shape
    num_kv_heads, kv_steps = k.shape[2], k.shape[1]
    group = num_heads // num_kv_heads
    bq, bkv = _block(steps), _block(kv_steps)
    sizes = splash.BlockSizes(block_q=bq, block_kv=bkv, block_kv_compute=bkv, block_q_dkv=bq,
                              block_kv_dkv=bkv, block_kv_dkv_compute=bkv, block_q_dq=bq, block_kv_dq=bkv)
    causal = masks.CausalMask((steps, kv_steps), offset=kv_steps - steps)
    mask = masks.MultiHeadMask([causal for _ in range(group)])
    kernel = splash.make_splash_mqa(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)
    # The kernel takes no softmax scale: the query is scaled before the call, in its dtype.
    q = (q.astype(jnp.float32) * head_dim ** -0.5).astype(q.dtype)
    qg = q.reshape(batch, steps, num_kv_heads, group, head_dim).transpose(0, 2, 3, 1, 4)  # [B, Hkv, G, T, D]
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, Hkv, T, D]

    def one_row(qr, kr, vr, q_seg, kv_seg):
        ids = splash.SegmentIds(q=q_seg, kv=kv_seg)
        return jax.vmap(lambda qh, kh_, vh_: kernel(qh, kh_, vh_, segment_ids=ids))(qr, kr, vr)

    out = jax.vmap(one_row)(qg, kh, vh, q_segment_ids.astype(jnp.int32), kv_segment_ids.astype(jnp.int32))
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, steps, num_heads, head_dim).astype(v.dtype)
