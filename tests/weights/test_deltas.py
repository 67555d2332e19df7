"""Versions published as deltas: bit-exact on both backends, chains and full versions, faults, collection."""

from __future__ import annotations

import io
import json

import jax
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlax_core.weights import IntegrityError, WeightFollower, WeightStore, WeightStoreConfig
from rlax_core.weights import manifest as mf
from rlax_core.weights.delta import CHUNK_ELEMENTS, DeltaEncoder, chunk_bounds, decode_delta
from rlax_core.weights.shard_io import read_shard, write_shard
from rlax_core.utils.storage import LocalStorage
from rlax_core.weights.tree import flatten_params

# ---------------------------------------------------------------------- params that train a little each version


def _special_float32() -> np.ndarray:
    """Bit patterns a delta must carry exactly: NaN payloads, infinities, -0.0, subnormals, the largest float."""
    return np.array([0x7FC00001, 0xFFC12345, 0x7F800000, 0xFF800000, 0x80000000, 0x00000001, 0x7F7FFFFF],
                    np.uint32).view(np.float32)


def trained_versions(count: int, seed: int = 0) -> list[dict]:
    """Params of versions 1..count: every float weight moves by ~1e-5 per version (an AdamW-like step),
    one tensor never changes, an integer tensor counts the version."""
    rng = np.random.default_rng(seed)
    weights = {
        "embed": rng.standard_normal((64, 40), np.float32) * 0.02,
        "layers": {"0": {"w": rng.standard_normal((40, 48), np.float32) * 0.02},
                   "1": {"w": rng.standard_normal((40, 48), np.float32) * 0.02}},
        "norm": np.ones(40, np.float32),
    }
    weights["embed"][0, :7] = _special_float32()
    versions = []
    for version in range(1, count + 1):
        versions.append({**weights, "step": np.array([version], np.int32)})
        weights = {
            "embed": _step(weights["embed"], rng),
            "layers": {k: {"w": _step(v["w"], rng)} for k, v in weights["layers"].items()},
            "norm": weights["norm"],
        }
    return versions


def _step(weights: np.ndarray, rng) -> np.ndarray:
    moved = weights - np.float32(1e-5) * np.sign(rng.standard_normal(weights.shape)).astype(np.float32)
    moved[~np.isfinite(weights)] = weights[~np.isfinite(weights)]  # NaN/inf stay what they were, bit for bit
    return moved


def assert_bits_equal(loaded: dict, expected: dict, dtype=None) -> None:
    got, want = flatten_params(loaded), flatten_params(expected)
    assert sorted(got) == sorted(want)
    for name, array in want.items():
        array = np.asarray(array)
        if dtype is not None and array.dtype.kind == "f":
            array = array.astype(dtype)
        loaded_array = np.asarray(got[name])
        assert loaded_array.dtype == array.dtype and loaded_array.shape == array.shape, name
        assert loaded_array.tobytes() == array.tobytes(), f"{name}: bits differ"


# ---------------------------------------------------------------------- the codec


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, np.int8, np.float64, np.complex128])
@pytest.mark.parametrize("size", [0, 1, CHUNK_ELEMENTS + 7])
def test_delta_codec_round_trips_every_bit(dtype, size):
    rng = np.random.default_rng(size)
    base = rng.integers(0, 256, size * np.dtype(dtype).itemsize, np.uint8).view(dtype)
    new = base.copy()
    new.view(np.uint8)[::5] ^= rng.integers(1, 256, new.view(np.uint8)[::5].size, np.uint8)
    sink, encoded_chunks = io.BytesIO(), []
    encoder = DeltaEncoder(sink, new.dtype, size, encoded_chunks.append)
    for start, stop in chunk_bounds(size):
        encoder.add(new[start:stop], base[start:stop])
    assert encoder.finish() == len(sink.getvalue()) == sum(map(len, encoded_chunks))
    rebuilt, seen = np.empty_like(new), []
    decode_delta(sink.getvalue(), base, rebuilt, seen.append)
    assert rebuilt.tobytes() == new.tobytes()
    assert sum(chunk.size for chunk in seen) == size


def test_delta_codec_refuses_what_does_not_decode_to_the_shard():
    base = np.arange(1000, dtype=np.float32)
    sink = io.BytesIO()
    encoder = DeltaEncoder(sink, base.dtype, base.size, lambda _: None)
    encoder.add(base + 1, base)
    encoder.finish()
    payload = sink.getvalue()
    out = np.empty_like(base)
    with pytest.raises(ValueError, match="fewer bytes"):
        decode_delta(payload[: len(payload) // 2], base, out, lambda _: None)
    with pytest.raises(ValueError, match="more bytes"):
        decode_delta(payload, base[:500], out[:500], lambda _: None)
    with pytest.raises(ValueError, match="does not decode"):
        decode_delta(b"not a zstd frame at all", base, out, lambda _: None)


def test_a_delta_applied_to_the_wrong_base_is_refused(tmp_path):
    storage = LocalStorage(tmp_path)
    base, new = np.arange(5000, dtype=np.float32), np.arange(5000, dtype=np.float32) * 1.0001
    nbytes, checksum, delta, _ = write_shard(storage, "t.delta", new, new.dtype, keep=False, base=base)
    shard = mf.ShardRecord("t.delta", ((0, 5000),), nbytes, checksum, delta)
    assert read_shard(storage, "t.delta", shard, new.dtype, base, where="t").tobytes() == new.tobytes()
    with pytest.raises(IntegrityError, match="wrong base"):
        read_shard(storage, "t.delta", shard, new.dtype, base + 1, where="t")


# ---------------------------------------------------------------------- through the store, on both backends


@pytest.mark.parametrize("publish_dtype", [None, "bfloat16"])
def test_deltas_round_trip_bit_exact(make_store, publish_dtype):
    versions = trained_versions(5)
    writer = make_store(full_snapshot_every=3, publish_dtype=publish_dtype)
    follower = WeightFollower(make_store(full_snapshot_every=3), as_numpy=True)
    cast_to = ml_dtypes.bfloat16 if publish_dtype else None
    for version, params in enumerate(versions, start=1):
        manifest = writer.publish(version, params)
        assert (manifest.base, manifest.chain_length) == [(None, 0), (1, 1), (2, 2), (None, 0), (4, 1)][version - 1]
        read_before = follower.store.counters.get("read_bytes", 0)
        assert follower.refresh() and follower.version == version
        assert_bits_equal(follower.params, params, cast_to)
        # The follower held the version before: it reads this version's files only (the deltas when it has them).
        assert follower.store.counters["read_bytes"] - read_before == manifest.stored_nbytes
        if manifest.base is not None:
            assert manifest.stored_nbytes < 0.7 * manifest.nbytes  # the XOR of small steps compresses
            assert {s.file.endswith(".delta") for t in manifest.tensors for s in t.shards} == {True}
    cold = make_store()  # holds nothing and keeps nothing: full version 4, then the delta of 5
    assert_bits_equal(cold.load(5, as_numpy=True), versions[4], cast_to)
    assert cold.counters["read_bytes"] == writer.manifest(4).stored_nbytes + writer.manifest(5).stored_nbytes
    assert_bits_equal(cold.load(3, as_numpy=True), versions[2], cast_to)  # full 1, then deltas 2 and 3


def test_corrupt_delta_is_never_applied_and_the_reader_keeps_its_version(make_store):
    versions = trained_versions(4)
    writer = make_store(full_snapshot_every=3)
    reader = make_store(full_snapshot_every=3)
    follower = WeightFollower(reader, as_numpy=True)
    writer.publish(1, versions[0])
    assert follower.refresh() and follower.version == 1
    writer.publish(2, versions[1])
    delta_file = next(s for t in writer.manifest(2).tensors if t.name == "embed" for s in t.shards).file
    path = f"{mf.version_dir(2)}/{delta_file}"
    data = bytearray(writer.storage.read(path))
    data[len(data) // 2] ^= 0x04
    writer.storage.write(path, bytes(data))

    assert not follower.refresh() and follower.version == 1 and reader.held_version == 1
    assert_bits_equal(follower.params, versions[0])
    assert 2 in follower.refused and "delta checksum mismatch" in follower.refused[2]
    with pytest.raises(IntegrityError, match=r"embed.*delta checksum mismatch.*not applied"):
        reader.load(2)
    writer.storage.write(path, bytes(data[:-5]))
    with pytest.raises(IntegrityError, match="truncated"):
        reader.load(2)
    assert reader.counters["rejected/integrity"] == 3 and reader.held_version == 1

    writer.publish(3, versions[2])  # built on the corrupt version 2: cannot be rebuilt either
    assert not follower.refresh() and follower.version == 1
    assert f"{mf.version_dir(2)}/{delta_file}" in follower.refused[3]
    writer.publish(4, versions[3])  # the next full version
    assert writer.manifest(4).base is None
    assert follower.refresh() and follower.version == 4
    assert_bits_equal(follower.params, versions[3])


def test_gc_keeps_the_bases_that_live_deltas_need(make_store):
    versions = trained_versions(6)
    writer = make_store(full_snapshot_every=4, gc_grace_s=0.0, keep=1)
    for version in (1, 2, 3, 4):  # 1 full, 2-4 deltas on the version before
        writer.publish(version, versions[version - 1])
        assert writer.gc() == []  # the newest needs every version down to 1
    reader = make_store()
    with reader.lease(3):  # a reader is loading version 3
        writer.publish(5, versions[4])  # a full version
        assert writer.gc() == [4]  # 3 is leased, and needs 2 and 1
        assert writer.versions() == [1, 2, 3, 5]
        assert_bits_equal(make_store().load(3, as_numpy=True), versions[2])
    writer.publish(6, versions[5])
    assert writer.gc() == [1, 2, 3]
    assert writer.versions() == [5, 6]
    assert not writer.storage.exists(f"{mf.version_dir(1)}/manifest.json")
    assert_bits_equal(make_store().load(6, as_numpy=True), versions[5])


# ---------------------------------------------------------------------- which chain a reader reads


def test_readers_apply_the_deltas_after_what_they_hold_or_start_from_the_last_full_version(tmp_path):
    versions = trained_versions(10)
    config = WeightStoreConfig(root=str(tmp_path), run_id="run-a", full_snapshot_every=3)
    with WeightStore(config) as writer:
        for version in range(1, 7):
            writer.publish(version, versions[version - 1], process_index=0, process_count=1)
        assert [writer.manifest(v).base for v in range(1, 7)] == [None, 1, 2, None, 4, 5]
        stored = {v: writer.manifest(v).stored_nbytes for v in range(1, 7)}

        def bytes_to_load(holding: int | None, version: int) -> int:
            with WeightStore(config) as reader:
                if holding is not None:
                    reader.load(holding, as_numpy=True)
                before = reader.counters.get("read_bytes", 0)
                assert_bits_equal(reader.load(version, as_numpy=True), versions[version - 1])
                return reader.counters["read_bytes"] - before

        assert bytes_to_load(5, 6) == stored[6]  # holds the base: one delta
        assert bytes_to_load(4, 6) == stored[5] + stored[6]  # holds the full version: the chain after it
        assert bytes_to_load(2, 6) == stored[4] + stored[5] + stored[6]  # holds another chain's version
        assert bytes_to_load(None, 6) == stored[4] + stored[5] + stored[6]
        assert bytes_to_load(6, 6) == 0  # held: served from memory after the marker and manifest checks
        assert bytes_to_load(6, 2) == stored[1] + stored[2]  # an older version: its own chain

        assert writer.publish(8, versions[7], process_index=0, process_count=1).base is None  # 4-5-6 was a whole chain
        # Versions the trainer skipped (superseded before they were written) do not matter: a delta is on
        # the version published before it.
        assert writer.publish(10, versions[9], process_index=0, process_count=1).base == 8
    with WeightStore(config) as restarted:  # a new writer holds nothing: it starts with a full version
        assert restarted.publish(11, versions[9], process_index=0, process_count=1).base is None


def test_sharded_tensors_are_published_as_deltas_per_shard(tmp_path):
    mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
    versions = trained_versions(2)
    sharded = [{"embed": jax.device_put(v["embed"], NamedSharding(mesh, P("fsdp", None))),
                "norm": jax.device_put(v["norm"], NamedSharding(mesh, P()))} for v in versions]
    config = WeightStoreConfig(root=str(tmp_path), run_id="run-a", full_snapshot_every=2)
    with WeightStore(config) as writer, WeightStore(config) as reader:
        writer.publish(1, sharded[0])
        reader.load(1, as_numpy=True)
        manifest = writer.publish(2, sharded[1])
        embed = next(t for t in manifest.tensors if t.name == "embed")
        assert len(embed.shards) == 8 and all(s.delta is not None for s in embed.shards)
        assert_bits_equal(reader.load(2, as_numpy=True), {"embed": versions[1]["embed"], "norm": versions[1]["norm"]})
        assert reader.counters["read_bytes"] == writer.manifest(1).stored_nbytes + manifest.stored_nbytes


def test_versions_written_before_deltas_existed_still_load(make_store):
    """Format 1: no base or chain length in the manifest, no delta field per shard, no base in the marker."""
    store = make_store(full_snapshot_every=2)
    versions = trained_versions(2)
    store.publish(1, versions[0])
    manifest = json.loads(store.storage.read(f"{mf.version_dir(1)}/manifest.json"))
    manifest.update(format=1)
    del manifest["base"], manifest["chain_length"]
    for tensor in manifest["tensors"]:
        for shard in tensor["shards"]:
            del shard["delta"]
    manifest_bytes = json.dumps(manifest).encode()
    marker = json.loads(store.storage.read(mf.marker_path(1)))
    del marker["base"]
    marker["manifest_checksum"] = mf.checksum(manifest_bytes)
    store.storage.write(f"{mf.version_dir(1)}/manifest.json", manifest_bytes)
    store.storage.write(mf.marker_path(1), json.dumps(marker).encode())
    reader = make_store(full_snapshot_every=2)
    assert_bits_equal(reader.load(1, as_numpy=True), versions[0])
    store.publish(2, versions[1])  # and a delta on it
    assert store.manifest(2).base == 1
    assert_bits_equal(reader.load(2, as_numpy=True), versions[1])
