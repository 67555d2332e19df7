"""Counts XLA compilations in this process (every jit cache miss, eager ops included), for tests that
say "nothing compiles after warm-up". A program the persistent compilation cache supplies counts too:
the test lane shares one cache between its processes (tests/conftest.py), and a program looked up
again after warm-up is a miss of the in-memory cache that the claim is about."""

import jax


class CompileCounter:
    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        jax.monitoring.register_event_listener(self._on_event)

    def _on_duration(self, name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            self.count += 1

    def _on_event(self, name, **kwargs):
        if name == "/jax/compilation_cache/cache_hits":
            self.count += 1


COMPILES = CompileCounter()  # one listener per process, shared by every test module
