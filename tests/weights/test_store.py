"""The weight store on a local folder and on gs:// (a real GCS API: the emulator), same tests for both."""

from __future__ import annotations

import json
import time

import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.weights import (
    ForeignRunError,
    IntegrityError,
    ManifestError,
    VersionExistsError,
    VersionNotCommittedError,
    WeightFollower,
)
from rlax_core.weights import manifest as mf
from tests.weights.versioned_params import assert_is_version, params_for


def test_publish_then_load_round_trips_exactly(make_store):
    store = make_store()
    assert store.latest() is None
    params = params_for(3)
    manifest = store.publish(3, params)
    assert params["norm"]["scale"].flags.writeable  # the caller's arrays are left as they were
    assert store.latest() == 3 and store.versions() == [3]
    assert manifest.version == 3 and manifest.run_id == "run-a"
    names = [t.name for t in manifest.tensors]
    assert names == ["embed/tokens", "layers/0/b", "layers/0/w", "layers/1/b", "layers/1/w", "norm/scale", "step"]
    assert all(len(t.shards) == 1 and len(t.shards[0].checksum) == 16 for t in manifest.tensors)
    assert store.manifest(3) == manifest
    assert_is_version(store.load(3, as_numpy=True), 3)
    loaded = store.load(3)  # jax arrays on the default device
    assert isinstance(loaded["layers"]["0"]["w"], type(jnp.zeros(1)))
    assert_is_version(loaded, 3)


def test_load_casts_floats_only(make_store):
    store = make_store()
    store.publish(1, params_for(1))
    loaded = store.load(1, dtype="bfloat16")
    assert loaded["embed"]["tokens"].dtype == jnp.bfloat16
    assert loaded["step"].dtype == jnp.int32  # integer tensors keep their dtype


def test_publish_dtype_casts_before_writing(make_store):
    store = make_store(publish_dtype="bfloat16")
    manifest = store.publish(1, params_for(1))
    dtypes = {t.name: t.dtype for t in manifest.tensors}
    assert dtypes["layers/0/w"] == "bfloat16" and dtypes["step"] == "int32"
    assert manifest.nbytes == sum(np.prod(t.shape) * (4 if t.name == "step" else 2) for t in manifest.tensors)
    assert_is_version(store.load(1, dtype="float32", as_numpy=True), 1)  # values are exact in bfloat16


def test_committed_versions_are_immutable(make_store):
    store = make_store()
    store.publish(5, params_for(5))
    with pytest.raises(VersionExistsError, match="immutable"):
        store.publish(5, params_for(6))
    assert store.counters["rejected/exists"] == 1
    assert_is_version(store.load(5, as_numpy=True), 5)


def test_watch_yields_new_versions_and_times_out_loudly(make_store):
    writer, reader = make_store(), make_store()
    watcher = reader.watch(timeout_s=0.3)
    writer.publish(1, params_for(1))
    assert next(watcher) == 1
    writer.publish(2, params_for(2))
    writer.publish(3, params_for(3))
    assert next(watcher) == 3  # the newest; superseded ones are skipped
    with pytest.raises(TimeoutError, match="no weight version newer than 3"):
        next(watcher)


def test_gc_keeps_newest_and_respects_grace_and_leases(make_store):
    store = make_store(gc_grace_s=0.0)
    for version in (1, 2, 3, 4):
        store.publish(version, params_for(version))
    with store.lease(2):  # a reader is loading version 2
        assert store.gc(keep=2) == [1]
    assert store.versions() == [2, 3, 4]
    assert store.gc(keep=2) == [2]
    assert store.versions() == [3, 4]
    assert not store.storage.exists(f"{mf.version_dir(1)}/manifest.json")
    with pytest.raises(VersionNotCommittedError):
        store.load(1)

    crashed = make_store(lease_ttl_s=0.01)  # a reader that died while loading version 3
    crashed.lease(3).__enter__()
    time.sleep(0.05)
    assert store.gc(keep=2) == [] and store.storage.list("leases") == []  # its lease lapsed and went

    patient = make_store(gc_grace_s=3600.0)
    patient.publish(5, params_for(5))
    assert patient.gc(keep=1) == []  # version 4 was superseded moments ago: readers may still want it
    assert patient.versions() == [3, 4, 5]


def test_gc_removes_abandoned_uncommitted_versions(make_store):
    store = make_store(gc_grace_s=0.0)
    store.publish(1, params_for(1))
    store.publish(2, params_for(2))
    store.storage.delete(mf.marker_path(1))  # as if the writer died before committing 1
    store.gc(keep=2)
    assert mf.version_dir(1) not in store.storage.list("")
    assert store.versions() == [2]


# ---------------------------------------------------------------------- faults: refused, counted, survived


def _tensor_file(store, version: int, name: str) -> str:
    tensor = next(t for t in store.manifest(version).tensors if t.name == name)
    return f"{mf.version_dir(version)}/{tensor.shards[0].file}"


def _follower_on_version_1(make_store):
    writer = make_store()
    writer.publish(1, params_for(1))
    reader = make_store()
    follower = WeightFollower(reader, as_numpy=True)
    assert follower.refresh() and follower.version == 1
    return writer, reader, follower


def _assert_follower_kept_version_1(follower):
    assert not follower.refresh()
    assert follower.version == 1
    assert_is_version(follower.params, 1)


def test_truncated_tensor_file_is_refused(make_store):
    writer, reader, follower = _follower_on_version_1(make_store)
    writer.publish(2, params_for(2))
    path = _tensor_file(writer, 2, "layers/1/w")
    writer.storage.write(path, writer.storage.read(path)[:-7])
    _assert_follower_kept_version_1(follower)
    assert reader.counters["rejected/integrity"] == 1
    with pytest.raises(IntegrityError, match=r"layers/1/w.*truncated"):
        reader.load(2)
    assert reader.counters["rejected/integrity"] == 2
    assert 2 in follower.refused and not follower.refresh()  # not retried on every poll


def test_flipped_bit_is_refused(make_store):
    writer, reader, follower = _follower_on_version_1(make_store)
    writer.publish(2, params_for(2))
    path = _tensor_file(writer, 2, "embed/tokens")
    data = bytearray(writer.storage.read(path))
    data[100] ^= 0x10
    writer.storage.write(path, bytes(data))
    _assert_follower_kept_version_1(follower)
    with pytest.raises(IntegrityError, match=r"embed/tokens.*checksum mismatch"):
        reader.load(2)
    assert reader.counters["rejected/integrity"] == 2


def test_missing_commit_marker_is_never_loaded(make_store):
    writer, reader, follower = _follower_on_version_1(make_store)
    writer.publish(2, params_for(2))
    writer.storage.delete(mf.marker_path(2))  # the writer died between its files and its marker
    assert reader.latest() == 1
    _assert_follower_kept_version_1(follower)
    with pytest.raises(VersionNotCommittedError, match="no commit marker"):
        reader.load(2)
    assert reader.counters["rejected/not_committed"] == 1


def test_version_of_another_run_is_refused(make_store):
    writer, reader, follower = _follower_on_version_1(make_store)
    make_store(run_id="run-b").publish(2, params_for(2))  # a stale run writing into the same root
    _assert_follower_kept_version_1(follower)
    with pytest.raises(ForeignRunError, match="run 'run-b'"):
        reader.load(2)
    assert reader.counters["rejected/foreign_run"] == 2


def test_manifest_of_another_run_swapped_in_is_refused(make_store):
    writer, reader, follower = _follower_on_version_1(make_store)
    other = make_store(run_id="run-b")
    other.publish(7, params_for(2))
    writer.publish(2, params_for(2))
    foreign = json.loads(other.storage.read(f"{mf.version_dir(7)}/manifest.json"))
    foreign["version"] = 2
    writer.storage.write(f"{mf.version_dir(2)}/manifest.json", json.dumps(foreign).encode())
    _assert_follower_kept_version_1(follower)
    with pytest.raises(ManifestError, match="checksum differs from its commit marker"):
        reader.load(2)


def test_follower_moves_on_to_the_next_good_version(make_store):
    writer, reader, follower = _follower_on_version_1(make_store)
    writer.publish(2, params_for(2))
    writer.storage.delete(_tensor_file(writer, 2, "norm/scale"))
    _assert_follower_kept_version_1(follower)
    writer.publish(3, params_for(3))
    assert follower.refresh() and follower.version == 3
    assert_is_version(follower.params, 3)
    assert follower.wait_for(3, timeout_s=1) == 3
    with pytest.raises(TimeoutError, match="no usable weight version >= 4"):
        follower.wait_for(4, timeout_s=0.1)


def test_metrics_are_written(make_store, tmp_path):
    from rlax_core.utils.metrics import MetricsWriter, read_metrics

    writer = make_store()
    writer.publish(1, params_for(1))
    path = _tensor_file(writer, 1, "layers/0/b")
    writer.storage.write(path, b"")
    with MetricsWriter(tmp_path / "m", tensorboard=False) as metrics:
        reader = make_store()
        reader.metrics = metrics
        with pytest.raises(IntegrityError):
            reader.load(1)
    rows = read_metrics(tmp_path / "m")
    assert rows[-1]["weights/rejected/integrity"] == 1 and rows[-1]["step"] == 1


def test_in_memory_fast_path_serves_the_publishing_process_only(make_store):
    trainer = make_store(in_memory_cache=True)
    params = params_for(4)
    trainer.publish(4, params)
    params["layers"]["0"]["w"][:] = -1  # the caller reuses its arrays: the published version must not change
    for tensor in trainer.manifest(4).tensors:  # storage loses the tensor files: only memory can serve them
        trainer.storage.delete(f"{mf.version_dir(4)}/{tensor.shards[0].file}")
    loaded = trainer.load(4, as_numpy=True)
    assert_is_version(loaded, 4)
    assert not loaded["layers"]["0"]["w"].flags.writeable
    with pytest.raises(IntegrityError, match="missing"):
        make_store().load(4)  # another process reads storage, and is refused
    trainer.storage.delete(mf.marker_path(4))
    with pytest.raises(VersionNotCommittedError):
        trainer.load(4)  # memory never serves a version that is not (or no longer) committed
