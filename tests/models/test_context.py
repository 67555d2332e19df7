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
