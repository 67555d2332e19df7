"""The flash attention kernels equal the dense reference (``rlax_core.models.attention``).

The TPU's splash kernel runs in Pallas interpret mode on this CPU, forward and gradient; the GPU
path is the same ``jax.nn.dot_product_attention`` call with XLA's implementation (no GPU here).
Only real (non-padding) queries are compared: a padding query's output is unspecified.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.models.attention import attention_for_platform, causal_attention, fits, same_segment_mask

BATCH, STEPS, HEADS, KV_HEADS, HEAD_DIM = 2, 256, 4, 2, 128


def _segments(kind: str) -> np.ndarray:
    ids = np.ones((BATCH, STEPS), np.int32)
    if kind == "left padding":
        ids[0, :40], ids[1, :170] = 0, 0
    elif kind == "right padding":
        ids[0, 200:], ids[1, 7:] = 0, 0
    elif kind == "packed":  # two and three sequences in a row, then padding
        ids[0, 100:] = 2
        ids[1, 60:130], ids[1, 130:250], ids[1, 250:] = 2, 3, 0
    return ids


def _operands(seed=0):
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (BATCH, STEPS, HEADS, HEAD_DIM), jnp.float32)
    k = jax.random.normal(keys[1], (BATCH, STEPS, KV_HEADS, HEAD_DIM), jnp.float32)
    v = jax.random.normal(keys[2], (BATCH, STEPS, KV_HEADS, HEAD_DIM), jnp.float32)
    cotangent = jax.random.normal(keys[3], q.shape, jnp.float32)
    return q, k, v, cotangent


def _loss(impl, segment_ids, cotangent):
    real = (segment_ids > 0)[:, :, None, None]

    def loss(q, k, v):
        out = causal_attention(q, k, v, segment_ids, impl=impl, interpret=True)
        return jnp.sum(jnp.where(real, out * cotangent, 0.0))

    return loss


@pytest.mark.parametrize("impl", ["splash", "cudnn"])
@pytest.mark.parametrize("kind", ["causal", "left padding", "right padding", "packed"])
def test_the_kernel_equals_dense_attention_forward_and_gradient(impl, kind):
    segment_ids = jnp.asarray(_segments(kind))
    q, k, v, cotangent = _operands()
    real = np.asarray(segment_ids > 0)
    dense = causal_attention(q, k, v, segment_ids, impl="dense")
    kernel = causal_attention(q, k, v, segment_ids, impl=impl, interpret=True)
    np.testing.assert_allclose(np.asarray(kernel)[real], np.asarray(dense)[real], atol=2e-5, rtol=2e-5)

    dense_grads = jax.grad(_loss("dense", segment_ids, cotangent), argnums=(0, 1, 2))(q, k, v)
    kernel_grads = jax.grad(_loss(impl, segment_ids, cotangent), argnums=(0, 1, 2))(q, k, v)
    for name, want, got in zip("qkv", dense_grads, kernel_grads):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=5e-5, rtol=5e-5, err_msg=f"d{name}")


def test_gqa_heads_attend_with_their_own_kv_head():
    """Query heads 0-1 use KV head 0 and 2-3 KV head 1: zeroing KV head 1's values zeroes exactly heads 2-3."""
    segment_ids = jnp.asarray(_segments("causal"))
    q, k, v, _ = _operands(1)
    out = causal_attention(q, k, v.at[:, :, 1].set(0.0), segment_ids, impl="splash", interpret=True)
    assert np.all(np.asarray(out[:, :, 2:]) == 0) and np.all(np.abs(np.asarray(out[:, :, :2])) > 0)


def test_packed_segments_do_not_see_each_other():
    segment_ids = jnp.asarray(_segments("packed"))
    mask = np.asarray(same_segment_mask(segment_ids))
    assert not mask[0, 150, :100].any() and mask[0, 150, 100:151].all() and not mask[0, 150, 151:].any()
    q, k, v, _ = _operands(2)
    alone = causal_attention(q[:1, 100:228], k[:1, 100:228], v[:1, 100:228], jnp.ones((1, 128), jnp.int32),
                             impl="splash", interpret=True)
    packed = causal_attention(q, k, v, segment_ids, impl="splash", interpret=True)
    np.testing.assert_allclose(np.asarray(packed[:1, 100:228]), np.asarray(alone), atol=2e-5, rtol=2e-5)


def test_each_platform_gets_its_kernel_and_splash_refuses_rows_it_cannot_tile():
    assert [attention_for_platform(p) for p in ("tpu", "gpu", "cpu")] == ["splash", "cudnn", "dense"]
    assert fits("splash", 512) and not fits("splash", 200) and fits("dense", 200)
    q, k, v, _ = _operands()
    with pytest.raises(ValueError, match="multiple of 128"):
        causal_attention(q[:, :200], k[:, :200], v[:, :200], jnp.ones((BATCH, 200), jnp.int32), impl="splash")


@pytest.mark.parametrize("impl", ["splash", "cudnn"])
def test_on_a_mesh_each_device_attends_over_its_rows_and_heads_whatever_q_k_v_shardings_come_in(impl):
    """A GQA model's q, k and v arrive sharded differently (query heads over ``tensor``, the two KV
    heads replicated, rows over ``fsdp`` or not): JAX's cuDNN partitioner refuses that ("Query, key
    and value should have same sharding"), so both kernels run under ``shard_map`` on the mesh. The
    result and its gradients equal dense attention's."""
    from jax.sharding import NamedSharding, PartitionSpec

    from rlax_core.parallel.config import MeshConfig
    from rlax_core.parallel.mesh import make_mesh

    mesh = make_mesh(MeshConfig(data=1, fsdp=2, tensor=2), jax.devices()[:4])
    segment_ids = jnp.asarray(_segments("packed"))
    q, k, v, cotangent = _operands(3)
    q = jax.device_put(q, NamedSharding(mesh, PartitionSpec("fsdp", None, "tensor", None)))
    k = jax.device_put(k, NamedSharding(mesh, PartitionSpec()))
    v = jax.device_put(v, NamedSharding(mesh, PartitionSpec(None, None, "tensor", None)))
    real = np.asarray(segment_ids > 0)

    def loss(impl, mesh):
        def of(q, k, v):
            out = causal_attention(q, k, v, segment_ids, impl=impl, mesh=mesh, interpret=True)
            return jnp.sum(jnp.where(real[:, :, None, None], out * cotangent, 0.0)), out
        return jax.jit(jax.value_and_grad(of, argnums=(0, 1, 2), has_aux=True))

    (_, want), want_grads = loss("dense", None)(q, k, v)
    (_, got), got_grads = loss(impl, mesh)(q, k, v)
    np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=2e-5, rtol=2e-5)
    for name, a, b in zip("qkv", got_grads, want_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-5, rtol=5e-5, err_msg=f"d{name}")
