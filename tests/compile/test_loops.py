"""compile.loops: XLA counts a loop body once; the factor weighs each computation by its trips."""

import jax
import jax.numpy as jnp
import pytest

from rlax_core.compile.loops import loop_factor

W, X = jnp.ones((16, 64, 64)), jnp.ones((8, 64))
PRODUCT = 2 * 8 * 64 * 64  # one [8, 64] x [64, 64] product


def layers(w, x):
    return jax.lax.scan(lambda c, wi: (jnp.tanh(c @ wi), None), x, w)[0]


@pytest.mark.parametrize("program, products, loops", [
    (lambda w, x: layers(w, x).sum(), 16, 1),
    # the backward pass runs its own loop: 3 products a layer in all (forward, and two in the backward)
    (jax.grad(lambda w, x: layers(w, x).sum()), 3 * 16, 2),
    # nested: 3 passes over the 16 layers
    (lambda w, x: jax.lax.scan(lambda c, _: (layers(w, c), None), x, None, length=3)[0].sum(), 3 * 16, 2),
], ids=["scan", "grad-of-scan", "nested"])
def test_each_loop_counts_its_trips(program, products, loops):
    compiled = jax.jit(program).lower(W, X).compile()
    found = loop_factor(compiled.as_text())
    assert found.product_flops == products * PRODUCT
    assert len(found.loops) == loops and not found.unknown_loops
    # XLA's own FLOPs count each body once: scaled by the factor they come to one run's.
    xla_flops = compiled.cost_analysis()["flops"]
    assert xla_flops < products * PRODUCT / 2 and xla_flops * found.factor >= products * PRODUCT


def test_a_loop_on_data_is_named_and_counted_once():
    def until_small(x):
        return jax.lax.while_loop(lambda c: jnp.sum(c) > 1.0, lambda c: (c @ W[0]) * 0.5, x)

    found = loop_factor(jax.jit(until_small).lower(X).compile().as_text())
    assert len(found.unknown_loops) == 1 and found.factor == 1.0 and found.product_flops == PRODUCT


def test_a_program_without_loops_has_factor_one():
    found = loop_factor(jax.jit(lambda w, x: (x @ w[0]).sum()).lower(W, X).compile().as_text())
    assert found.factor == 1.0 and found.loops == () and found.product_flops == PRODUCT


# libtpu's optimised HLO writes no known_trip_count: the loop's condition and init say it (the shape
# of the layer scan of tests/fixtures/compile/small_qwen2_tpu.yaml's update, cut to one product).
TPU_STYLE = """HloModule jit_step

%body (p: (s32[], f32[8,64], f32[64,64])) -> (s32[], f32[8,64], f32[64,64]) {
  %p = (s32[]{:T(128)}, f32[8,64]{1,0:T(8,128)}, f32[64,64]{1,0:T(8,128)}) parameter(0)
  %i = s32[]{:T(128)} get-tuple-element(%p), index=0
  %x = f32[8,64]{1,0:T(8,128)} get-tuple-element(%p), index=1
  %w = f32[64,64]{1,0:T(8,128)} get-tuple-element(%p), index=2
  %convolution.1 = f32[8,64]{1,0:T(8,128)} convolution(%x, %w), window={size=1}, dim_labels=bf_io->bf
  %one = s32[]{:T(128)} constant(1)
  %next = s32[]{:T(128)} add(%i, %one)
  ROOT %t = (s32[]{:T(128)}, f32[8,64]{1,0:T(8,128)}, f32[64,64]{1,0:T(8,128)}) tuple(%next, %convolution.1, %w)
}

%cond (q: (s32[], f32[8,64], f32[64,64])) -> pred[] {
  %limit = s32[]{:T(128)} constant(%LIMIT%)
  %q = (s32[]{:T(128)}, f32[8,64]{1,0:T(8,128)}, f32[64,64]{1,0:T(8,128)}) parameter(0)
  %counter = s32[]{:T(128)} get-tuple-element(%q), index=0
  ROOT %lt.1 = pred[]{:T(512)} compare(%counter, %limit), direction=LT
}

ENTRY %main (x: f32[8,64], w: f32[64,64]) -> f32[8,64] {
  %x = f32[8,64]{1,0:T(8,128)} parameter(0)
  %w = f32[64,64]{1,0:T(8,128)} parameter(1)
  %start = s32[]{:T(128)} constant(%START%)
  %copy.1 = s32[]{:T(128)} copy(%start)
  %init = (s32[]{:T(128)}, f32[8,64]{1,0:T(8,128)}, f32[64,64]{1,0:T(8,128)}) tuple(%copy.1, %x, /*index=2*/%w)
  %while.1 = (s32[]{:T(128)}, f32[8,64]{1,0:T(8,128)}, f32[64,64]{1,0:T(8,128)}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,64]{1,0:T(8,128)} get-tuple-element(%while.1), index=1
}
"""


@pytest.mark.parametrize("start, limit", [(0, 28), (4, 28)])
def test_a_counted_loop_without_a_trip_count_is_read_from_its_condition(start, limit):
    found = loop_factor(TPU_STYLE.replace("%START%", str(start)).replace("%LIMIT%", str(limit)))
    assert found.loops == (("while.1", limit - start),) and found.factor == limit - start
    assert found.product_flops_once == PRODUCT  # the convolution is a [8, 64] x [64, 64] product
