"""A version damaged after its commit: readers fall back and report it, the writer repairs it, readers return."""

from __future__ import annotations

import pytest

from rlax_core.weights import IntegrityError, WeightFollower
from rlax_core.weights import manifest as mf
from rlax_core.weights.repair import heal_if_refused, refused_versions, repair_version
from tests.weights.versioned_params import assert_is_version, params_for


def _corrupt(store, version: int, name: str = "layers/1/w") -> str:
    tensor = next(t for t in store.manifest(version).tensors if t.name == name)
    path = f"{mf.version_dir(version)}/{tensor.shards[0].file}"
    data = bytearray(store.storage.read(path))
    data[5] ^= 0x40
    store.storage.write(path, bytes(data))
    return path


def test_a_fresh_reader_falls_back_to_the_newest_version_that_verifies(make_store):
    writer = make_store()
    for version in (1, 2, 3):
        writer.publish(version, params_for(version))
    _corrupt(writer, 3)
    reader = make_store()
    follower = WeightFollower(reader, as_numpy=True)
    assert follower.refresh() and follower.version == 2
    assert_is_version(follower.params, 2)
    assert set(follower.refused) == {3} and reader.counters["rejected/integrity"] == 1
    assert list(refused_versions(writer)) == [3]  # reported for the writer to repair
    assert not follower.refresh() and reader.counters["rejected/integrity"] == 1  # not retried on every poll


def test_a_reader_with_nothing_below_its_bound_loads_nothing(make_store):
    writer = make_store()
    writer.publish(2, params_for(2))
    _corrupt(writer, 2)
    follower = WeightFollower(make_store(), as_numpy=True)
    assert not follower.refresh() and follower.version is None and follower.params is None
    writer.publish(3, params_for(3))
    assert not follower.refresh(up_to=2)  # the bound holds it to versions <= 2
    assert follower.refresh(up_to=3) and follower.version == 3


def test_the_writer_repairs_a_refused_version_and_the_reader_takes_it(make_store):
    writer = make_store()
    writer.publish(1, params_for(1))
    writer.publish(2, params_for(2))
    damaged = _corrupt(writer, 2)
    reader = make_store()
    follower = WeightFollower(reader, as_numpy=True)
    assert follower.refresh() and follower.version == 1
    assert not heal_if_refused(writer, 1, params_for(1))  # nobody refused version 1: nothing to do
    assert heal_if_refused(writer, 2, params_for(2))
    assert refused_versions(writer) == {} and writer.counters["repaired"] == 1
    assert follower.refresh() and follower.version == 2  # its report is gone: tried again, verified
    assert_is_version(follower.params, 2)
    assert not follower.refused
    assert repair_version(writer, 2, params_for(2)) == []  # intact now: nothing rewritten
    assert damaged.endswith(".bin")


def test_params_of_another_version_do_not_repair_it(make_store):
    writer = make_store()
    writer.publish(2, params_for(2))
    _corrupt(writer, 2)
    follower = WeightFollower(make_store(), as_numpy=True)
    assert not follower.refresh()
    with pytest.raises(IntegrityError, match="do not reproduce"):
        repair_version(writer, 2, params_for(3))
    assert not heal_if_refused(writer, 2, params_for(3))  # logged, the reports left for a real repair
    assert list(refused_versions(writer)) == [2]
    assert not follower.refresh() and follower.version is None


def test_a_bfloat16_version_is_repaired_byte_for_byte(make_store):
    writer = make_store(publish_dtype="bfloat16")
    writer.publish(1, params_for(1))  # version 1's values are exact in bfloat16
    _corrupt(writer, 1)
    follower = WeightFollower(make_store(), as_numpy=True, dtype="float32")
    assert not follower.refresh()
    assert len(repair_version(writer, 1, params_for(1))) == 1  # float32 params, cast as the publish did
    assert follower.refresh() and follower.version == 1
    assert_is_version(follower.params, 1)
