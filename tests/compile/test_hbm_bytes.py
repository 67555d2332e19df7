"""A decode step's HBM bytes on TPU (``compile.report.hbm_bytes_accessed``), against a program whose
bytes are known: eight MLP layers of int8 (or bfloat16) kernels and a 64-row activation, compiled for
one v6e chip without one (libtpu, the lock-tpu environment). XLA:TPU's own count adds the copies
that memory-space assignment makes of the kernels into on-chip memory; with it off each kernel is
counted once."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from rlax_core.compile.report import hbm_bytes_accessed, xla_cost
from rlax_core.compile.topology import slice_devices

pytestmark = pytest.mark.tpu

LAYERS, HIDDEN, INTERMEDIATE, ROWS = 8, 5120, 3456, 64


def _mlp(x, kernels):
    for up, down in kernels:
        x = (jax.nn.gelu(x @ up.astype(jnp.bfloat16)) @ down.astype(jnp.bfloat16)).astype(jnp.bfloat16)
    return x


@pytest.mark.parametrize("dtype", ["int8", "bfloat16"])
def test_hbm_bytes_count_each_kernel_once_where_xlas_count_adds_their_on_chip_copies(dtype):
    sharding = jax.sharding.SingleDeviceSharding(slice_devices("v6e", chips=8, chips_per_host=4)[0])
    spec = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=sharding)
    kernels = [(spec((HIDDEN, INTERMEDIATE), dtype), spec((INTERMEDIATE, HIDDEN), dtype)) for _ in range(LAYERS)]
    lowered = jax.jit(_mlp).lower(spec((ROWS, HIDDEN), jnp.bfloat16), kernels)
    kernel_bytes = LAYERS * 2 * HIDDEN * INTERMEDIATE * jnp.dtype(dtype).itemsize
    activations = LAYERS * 2 * ROWS * (HIDDEN + INTERMEDIATE) * 2 * 2  # each product's input and output, bfloat16
    as_run = xla_cost(lowered.compile())["bytes accessed"]
    hbm = hbm_bytes_accessed(lowered)
    assert kernel_bytes <= hbm <= kernel_bytes + activations
    assert as_run > 1.5 * kernel_bytes  # the on-chip copies: 3.9x (int8) and 1.9x (bfloat16) with libtpu 0.0.42.1
