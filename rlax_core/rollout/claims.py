"""Claims on schedule steps: which steps this process has handed to generation and not yet finished.

The schedule offers a step again only when nobody holds a claim on it, so a step is not generated
twice while it is in flight; a claim older than its timeout is taken for lost (a dropped bundle) and
the step is offered again. Correctness does not rest on claims: group writes are idempotent, so a
step generated twice is written twice under the same names.

The claims live in this process (``process_claims()``): every DoFn instance and harness thread of a
worker shares them. The interface is what the rollout needs of any claim store (``try_claim``,
``release``), so one that holds across processes and VMs can take its place.
"""

from __future__ import annotations

import threading
import time

DEFAULT_TIMEOUT_S = 300.0


class StepClaims:
    """Thread-safe claims on ``(run, step)``, each valid for ``timeout_s`` seconds."""

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = timeout_s
        self._claimed_at: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    def held(self, run: str, step: int) -> bool:
        """Whether ``step`` is claimed and the claim has not timed out."""
        with self._lock:
            return self._held(run, step, time.monotonic())

    def try_claim(self, run: str, step: int) -> bool:
        """Claim ``step`` unless a live claim holds it; True when this call claimed it."""
        now = time.monotonic()
        with self._lock:
            if self._held(run, step, now):
                return False
            self._claimed_at[(run, step)] = now
            return True

    def release(self, run: str, step: int) -> None:
        """The step is written (or deferred): the schedule may offer it again."""
        with self._lock:
            self._claimed_at.pop((run, step), None)

    def _held(self, run: str, step: int, now: float) -> bool:
        claimed = self._claimed_at.get((run, step))
        return claimed is not None and now - claimed < self.timeout_s


_process_claims = StepClaims()


def process_claims() -> StepClaims:
    """This process's claims, shared by the schedule and the generators of every DoFn instance."""
    return _process_claims
