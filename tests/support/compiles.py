"""Counts XLA backend compilations in this process (every jit cache miss, eager ops included), for
tests that say "nothing compiles after warm-up"."""

import jax


class CompileCounter:
    def __init__(self):
        self.count = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, name, duration, **kwargs):
        if name == "/jax/core/compile/backend_compile_duration":
            self.count += 1


COMPILES = CompileCounter()  # one listener per process, shared by every test module
