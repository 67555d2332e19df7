"""Context parallelism (models.context): rows split over the ``context`` axis of 8 simulated
devices give the one-device forward and gradients, padded and packed rows alike."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.models.config import toy_config
from rlax_core.models.context import balanced_order
from rlax_core.models.transformer import forward, init_params
from rlax_core.parallel import MeshConfig, make_mesh
from rlax_core.training.logprobs import token_logprobs

MODEL = toy_config()
STEPS = 64


def test_the_balanced_order_gives_every_chip_an_early_and_a_late_chunk():
    order = balanced_order(16, 4)
    assert sorted(order.tolist()) == list(range(16))
    per_chip = order.reshape(4, 4)
    assert per_chip[0].tolist() == [0, 1, 14, 15] and per_chip[3].tolist() == [6, 7, 8, 9]
    # causal work per chip (keys each query sees) is the same for every chip
    assert len({int(np.sum(chip + 1)) for chip in per_chip}) == 1
    with pytest.raises(ValueError, match="multiple of 8"):
        balanced_order(12, 4)


def rows(packed: bool):
    rng = np.random.default_rng(0)
    tokens = rng.integers(3, MODEL.vocab_size, (4, STEPS)).astype(np.int32)
    if packed:  # three samples in a row, positions restarting in each, padding at the end
        segments = np.repeat([[1] * 20 + [2] * 30 + [3] * 10 + [0] * 4], 4, axis=0).astype(np.int32)
        positions = np.concatenate([np.arange(20), np.arange(30), np.arange(10), np.zeros(4)])[None].repeat(4, 0)
        return dict(tokens=tokens, segment_ids=segments, positions=positions.astype(np.int32)), segments[:, 1:] > 0
    mask = (np.arange(STEPS)[None] < np.array([[64], [40], [17], [60]])).astype(np.int32)
    return dict(tokens=tokens, attention_mask=mask), mask[:, 1:] > 0


@pytest.mark.slow  # two minutes a case on the shared 2-core machine: 8 simulated devices
@pytest.mark.parametrize("mesh_config", [MeshConfig(data=1, fsdp=1, context=8), MeshConfig(data=2, fsdp=1, context=4),
                                         MeshConfig(data=1, fsdp=2, context=2, tensor=2)],
                         ids=["context8", "data2-context4", "fsdp2-context2-tensor2"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_context_parallel_forward_and_gradients_equal_one_devices(mesh_config, packed):
    assert len(jax.devices()) == 8, "conftest simulates 8 CPU devices"
    mesh = make_mesh(mesh_config, jax.devices())
    params = init_params(MODEL, jax.random.key(0))
    inputs, real = rows(packed)
    weights = jnp.asarray(np.random.default_rng(1).random(real.shape) * real, jnp.float32)

    def loss(params, mesh):
        extra = {k: v for k, v in inputs.items() if k != "tokens"}
        logprobs, entropy = token_logprobs(params, MODEL, inputs["tokens"], mesh=mesh, **extra)
        return jnp.sum(logprobs * weights) + 0.1 * jnp.sum(entropy * weights)

    one_loss, one_grads = jax.jit(jax.value_and_grad(lambda p: loss(p, None)))(params)
    cp_loss, cp_grads = jax.jit(jax.value_and_grad(lambda p: loss(p, mesh)))(params)
    np.testing.assert_allclose(float(cp_loss), float(one_loss), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5),
                 one_grads, cp_grads)
    extra = {k: v for k, v in inputs.items() if k != "tokens"}
    logits = jax.jit(lambda p: forward(p, MODEL, inputs["tokens"], mesh=mesh, **extra))(params)
    expected = forward(params, MODEL, inputs["tokens"], **extra)
    np.testing.assert_allclose(np.asarray(logits)[:, :-1][real], np.asarray(expected)[:, :-1][real],
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["padded", "packed"])  # 4 s and 2 s at a load of 1.4 (90 s at 25)
def test_splash_chunks_equal_dense_chunks_forward_and_gradient(kind):
    """Each chip's two chunks in the splash kernel (Pallas interpret mode on this CPU; keys turned
    to each chunk, ``models.context``) give the dense chunks' attention and gradients: 2 chips, rows
    of 512 tokens (chunks of 128, the kernel's smallest), GQA 4 / 2 heads of 128."""
    from rlax_core.models.context import context_attention, shard_tokens

    steps, shards = 512, 2
    mesh = make_mesh(MeshConfig(data=1, fsdp=1, context=shards), jax.devices()[:shards])
    keys = jax.random.split(jax.random.key(3), 4)
    q = jax.random.normal(keys[0], (2, steps, 4, 128), jnp.float32)
    k, v = (jax.random.normal(key, (2, steps, 2, 128), jnp.float32) for key in keys[1:3])
    segments = np.ones((2, steps), np.int32)
    if kind == "packed":  # sequences across the chunks' borders, padding at the end
        segments[0, 100:300], segments[0, 300:] = 2, 3
        segments[1, 200:450], segments[1, 450:] = 2, 0
    else:
        segments[1, 350:] = 0
    order = balanced_order(steps, shards)
    q, k, v, segments = (shard_tokens(jnp.asarray(x)[:, order], mesh) for x in (q, k, v, segments))
    cotangent = jax.random.normal(keys[3], q.shape, jnp.float32) * (segments > 0)[:, :, None, None]
    index = jnp.asarray(order, jnp.int32)

    def loss(impl):
        attend = lambda q, k, v: context_attention(q, k, v, segments, index, mesh, impl, interpret=True)  # noqa: E731
        return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(attend(q, k, v) * cotangent), argnums=(0, 1, 2)))

    (dense, dense_grads), (splash, splash_grads) = loss("dense")(q, k, v), loss("splash")(q, k, v)
    np.testing.assert_allclose(float(splash), float(dense), rtol=1e-5)
    for a, b in zip(splash_grads, dense_grads):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=2e-5)
    hlo = jax.jit(lambda q, k, v: context_attention(q, k, v, segments, index, mesh, "splash", interpret=True)
                  ).lower(q, k, v).as_text()
    assert "splash" in hlo or "mqa" in hlo
