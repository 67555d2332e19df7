"""Shard I/O that hangs fails loudly after ``io_timeout_s``: a reader keeps its version, a writer commits nothing."""

from __future__ import annotations

import contextlib
import threading

import pytest

from rlax_core.config import ConfigError
from rlax_core.weights import StorageTimeoutError, WeightFollower, WeightStoreConfig, WeightStoreError
from rlax_core.utils.storage import Storage
from tests.weights.versioned_params import assert_is_version, params_for

STALL_LIMIT_S = 30.0  # a stalled call gives up after this long, so a broken test cannot hang the suite


class StalledStorage:
    """A real backend (the test's local folder or gs://) whose tensor-file reads or writes block until released.

    Control files (manifests, commit markers, leases) pass straight through; only ``.bin``/``.delta``
    files stall, as a hung GCS request or a dead NFS mount would.
    """

    def __init__(self, inner: Storage, *, reads: bool = False, writes: bool = False):
        self.inner, self.url = inner, inner.url
        self.stall_reads, self.stall_writes = reads, writes
        self.released, self.stalled = threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _stall(self, path: str, enabled: bool) -> None:
        if enabled and path.endswith((".bin", ".delta")):
            self.stalled.set()
            assert self.released.wait(STALL_LIMIT_S), f"{path}: never released"

    def read(self, path: str) -> bytes:
        self._stall(path, self.stall_reads)
        return self.inner.read(path)

    @contextlib.contextmanager
    def reader(self, path: str):
        self._stall(path, self.stall_reads)
        with self.inner.reader(path) as opened:
            yield opened

    @contextlib.contextmanager
    def writer(self, path: str):
        self._stall(path, self.stall_writes)
        with self.inner.writer(path) as sink:
            yield sink


def test_io_timeout_must_be_positive():
    with pytest.raises(ConfigError, match="io_timeout_s"):
        WeightStoreConfig(root="/tmp/w", run_id="run-a", io_timeout_s=0)


def test_hung_shard_read_is_refused_and_the_reader_keeps_its_version(make_store):
    writer = make_store()
    writer.publish(1, params_for(1))
    reader = make_store(io_timeout_s=0.2)
    follower = WeightFollower(reader, as_numpy=True)
    assert follower.refresh() and follower.version == 1
    writer.publish(2, params_for(2))
    stalled = StalledStorage(reader.storage, reads=True)
    reader.storage = stalled
    try:
        assert not follower.refresh()  # version 2's reads hang: refused after 0.2 s, not waited on forever
        assert stalled.stalled.is_set()
        assert follower.version == 1
        assert_is_version(follower.params, 1)
        assert "version 2: shard reads of tensor 'embed/tokens'" in follower.refused[2]
        assert "io_timeout_s=0.2s" in follower.refused[2]
        assert reader.counters["rejected/timeout"] == 1
        with pytest.raises(StorageTimeoutError, match=r"version 2: shard reads .* did not finish") as caught:
            reader.load(2)
        assert isinstance(caught.value, WeightStoreError) and isinstance(caught.value, TimeoutError)
        assert reader.counters["rejected/timeout"] == 2 and reader.counters["loaded"] == 1  # version 1 only
        assert reader.storage.list("leases") == []  # the failed loads released their leases
    finally:
        stalled.released.set()
    writer.publish(3, params_for(3))
    assert follower.refresh() and follower.version == 3  # storage recovered: the next version loads
    assert_is_version(follower.params, 3)


def test_hung_shard_write_fails_the_publish_and_commits_nothing(make_store):
    writer = make_store(io_timeout_s=0.2)
    writer.publish(1, params_for(1))
    stalled = StalledStorage(writer.storage, writes=True)
    writer.storage = stalled
    try:
        with pytest.raises(StorageTimeoutError, match=r"version 2: shard writes of tensor 'embed/tokens' did not "
                                                      r"finish within io_timeout_s=0.2s"):
            writer.publish(2, params_for(2))
        assert writer.counters["rejected/timeout"] == 1
        assert writer.versions() == [1] and not writer.is_committed(2)
        with pytest.raises(StorageTimeoutError, match=r"still running after io_timeout_s=0.2s"):
            writer.close()  # close waits for running I/O, but not forever either
    finally:
        stalled.released.set()
    assert_is_version(make_store().load(1, as_numpy=True), 1)
