"""The engine's measurement clock: seconds per program, each waited for; nothing without a clock."""

import contextlib

import jax.numpy as jnp

from rlax_core.inference.phase_clock import PhaseClock, timed


def test_a_clock_adds_each_phases_seconds_and_no_clock_is_a_no_op():
    clock = PhaseClock()
    for _ in range(2):
        with timed(clock, "prefill", lambda: out):
            out = jnp.ones((64, 64)) @ jnp.ones((64, 64))
    with timed(clock, "decode", lambda: out):
        out = out + 1
    assert set(clock.seconds) == {"prefill", "decode"} and all(s > 0 for s in clock.seconds.values())
    assert isinstance(timed(None, "prefill", lambda: out), contextlib.nullcontext)
