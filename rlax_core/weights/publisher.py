"""``AsyncPublisher``: the trainer publishes weights without waiting for storage.

``submit`` only pins or dispatches a copy of the params (see :func:`stage_params`) and returns; a background thread writes and commits. At
most one publication is in flight and at most one waits behind it: a newer submit replaces the waiting
one (counted as superseded), so memory stays bounded at two staged copies however fast the trainer runs.
The one in flight always finishes, so that a trainer faster than storage still commits versions.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Mapping

import numpy as np

from rlax_core.utils.dtypes import dtype as dtype_of
from rlax_core.utils.dtypes import is_float
from rlax_core.weights.errors import VersionExistsError
from rlax_core.weights.store import WeightStore

log = logging.getLogger(__name__)
COMMIT_TIMES_KEPT = 16


def stage_params(params: Mapping[str, Any], publish_dtype: str | None = None) -> tuple[Any, list]:
    """A private view of ``params`` that survives the trainer donating or overwriting them at once.

    Returns ``(staged, pins)``; keep ``pins`` alive until the staged params are written.

    * A ready jax array in host memory (the CPU backend) is not copied at all: a zero-copy numpy view
      of each shard pins its buffer, and jax does not donate a buffer that is viewed from outside, so
      the trainer's next step writes fresh buffers instead. A cast to ``publish_dtype`` happens later,
      in the publisher's threads, chunk by chunk as the shard is written: on CPU a whole-tensor XLA
      cast allocates the full output first and took 2-3x longer here (page faults).
    * A jax array on an accelerator, to be cast, gets one dispatched device op (the cast makes a new
      buffer): the call returns at once, the cast runs while the next step is dispatched, and the
      device-to-host transfer, of the smaller dtype, happens in the publisher's thread.
    * Any other jax array gets a dispatched device copy, as for a cast.
    * Host (numpy) leaves are copied synchronously.
    """
    import jax

    target = dtype_of(publish_dtype) if publish_dtype else None
    pins: list = []

    def stage(leaf):
        if isinstance(leaf, jax.Array):
            if all(d.platform == "cpu" for d in leaf.devices()) and leaf.is_ready():
                pins.extend(np.asarray(shard.data) for shard in leaf.addressable_shards)
                return leaf
            if target is not None and is_float(np.dtype(leaf.dtype)) and leaf.dtype != target:
                return leaf.astype(target)  # a fresh buffer: nothing to protect
            return jax.numpy.copy(leaf)
        array = np.asarray(leaf)
        if target is not None and is_float(array.dtype):
            return array.astype(target)
        return array.copy()

    return jax.tree.map(stage, params), pins


class AsyncPublisher:
    """Publish from the training loop: ``submit(step, params)`` each time, ``flush()`` before exit."""

    def __init__(self, store: WeightStore):
        self.store = store
        self._cond = threading.Condition()
        self._pending: tuple[int, Any] | None = None
        self._in_flight: int | None = None
        self._error: BaseException | None = None
        self._closed = False
        self.last_committed: int | None = None
        # version -> wall clock (time.time()) of its commit, for the newest COMMIT_TIMES_KEPT versions:
        # the loop's step timeline (rlax_core.utils.timeline) joins it with the rollout side's clocks.
        self.commit_times: dict[int, float] = {}
        self.superseded = 0
        self._thread = threading.Thread(target=self._run, name="weights-publisher", daemon=True)
        self._thread.start()

    def submit(self, version: int, params: Mapping[str, Any], *, adapter: Mapping[str, Any] | None = None) -> None:
        """Stage ``params`` as ``version`` and return; raises the error of a failed earlier publication.
        ``adapter``: as for ``WeightStore.publish`` (an adapter-only version)."""
        self.raise_if_failed()
        staged = stage_params(params, self.store.config.publish_dtype)  # (params, pins) travel together
        with self._cond:
            if self._closed:
                raise RuntimeError("AsyncPublisher is closed")
            if self._pending is not None:
                self.superseded += 1
                self.store.count("superseded", version)
                log.info("weight version %d superseded by %d before it was written", self._pending[0], version)
            self._pending = (version, (*staged, adapter))
            self._cond.notify_all()

    def flush(self, timeout_s: float | None = None) -> int | None:
        """Wait until everything submitted is committed (or superseded); returns the last committed version."""
        timeout_s = self.store.config.commit_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._pending is not None or self._in_flight is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    busy = self._in_flight if self._in_flight is not None else self._pending[0]
                    raise TimeoutError(f"weight publication of version {busy} did not finish within {timeout_s:.0f}s")
                self._cond.wait(left)
        self.raise_if_failed()
        return self.last_committed

    def close(self, timeout_s: float | None = None) -> None:
        try:
            self.flush(timeout_s)
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            self._thread.join(timeout=5)
        # Reached only when flush succeeded: nothing was in flight, so the thread had only to wake and return.
        if self._thread.is_alive():
            raise TimeoutError("the weight publisher's thread did not stop within 5s of close()")

    def __enter__(self) -> "AsyncPublisher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def raise_if_failed(self) -> None:
        """Raise the error of a failed earlier publication (once). A trainer waiting for rollouts calls
        it while it waits: a version that never commits means no rollouts will come to wait for."""
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"an earlier weight publication failed: {error}") from error

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                (version, staged), self._pending = self._pending, None
                self._in_flight = version
            try:
                self.store.publish(version, staged[0], adapter=staged[2])
                self.last_committed = version
                self.commit_times[version] = time.time()
                for old in sorted(self.commit_times)[:-COMMIT_TIMES_KEPT]:
                    del self.commit_times[old]
            except VersionExistsError:
                # After a restart from an older checkpoint the trainer reaches steps it already
                # published; the committed version stays (immutable) and readers keep using it.
                log.warning("weight version %d was already committed; kept the committed one", version)
            except BaseException as error:  # noqa: BLE001 - handed to the trainer thread on its next call
                log.exception("publishing weight version %d failed", version)
                with self._cond:
                    self._error = error
            finally:
                del staged
                with self._cond:
                    self._in_flight = None
                    self._cond.notify_all()
