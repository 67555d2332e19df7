"""``ShardPool``: a weight store's shard reads and writes in flight, each bounded by ``io_timeout_s``.

A tensor's shards are read or written in parallel on a pool sized for the storage: object stores are
latency-bound and gain from many requests in flight; a local disk is bandwidth-bound, and more
writers than cores only contend (measured: 8 threads on 2 cores wrote 1 GB 2-3x slower than 1 or 2).
A storage call that hangs (a bucket that stops answering) fails the version loudly after
``io_timeout_s`` instead of holding its caller; ``close`` waits that long for stragglers.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for_futures
from typing import Any, Callable

from rlax_core.utils.storage import FsspecStorage, Storage
from rlax_core.weights.config import WeightStoreConfig
from rlax_core.weights.errors import StorageTimeoutError


class ShardPool:
    def __init__(self, storage: Storage, config: WeightStoreConfig):
        self.storage, self.timeout_s = storage, config.io_timeout_s
        self.threads = (config.io_threads if isinstance(storage, FsspecStorage)
                        else min(config.io_threads, os.cpu_count() or 1))
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="weights-io")
        self._lock = threading.Lock()
        self._running: set[Future] = set()  # shard reads and writes not finished yet (close() waits for them)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        future = self._pool.submit(fn, *args)
        with self._lock:
            self._running.add(future)
        future.add_done_callback(self._done)  # runs at once if it is already done
        return future

    def _done(self, future: Future) -> None:
        with self._lock:
            self._running.discard(future)

    def results(self, futures: list[Future], version: int, tensor: str, what: str) -> list[Any]:
        """The results of one tensor's shard ``futures``, in order, waiting at most ``io_timeout_s`` in all."""
        deadline = time.monotonic() + self.timeout_s
        results = []
        for future in futures:
            try:
                results.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except TimeoutError as error:
                if future.done() and future.exception() is error:
                    raise  # the storage call's own timeout, not ours
                raise StorageTimeoutError(f"version {version}: shard {what} of tensor {tensor!r} did not finish "
                                          f"within io_timeout_s={self.timeout_s:g}s ({self.storage.url} hangs or is "
                                          "too slow)") from None
        return results

    def close(self) -> None:
        """Wait up to ``io_timeout_s`` for shard I/O still running, then stop the threads.

        Raises ``StorageTimeoutError`` when some shard I/O is still stuck then (its thread is left behind).
        """
        self._pool.shutdown(wait=False)
        with self._lock:
            running = list(self._running)
        _, stuck = wait_for_futures(running, timeout=self.timeout_s)
        if stuck:
            raise StorageTimeoutError(f"closing the weight store on {self.storage.url}: {len(stuck)} shard read(s) or "
                                      f"write(s) still running after io_timeout_s={self.timeout_s:g}s")
