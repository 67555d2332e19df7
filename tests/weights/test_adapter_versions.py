"""Adapter-only weight versions: pinned to their base, loaded by what changed, and their base kept by GC."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from rlax_core.models.config import toy_config
from rlax_core.models.lora import init_adapters, merge
from rlax_core.models.lora_config import LoraConfig
from rlax_core.models.transformer import init_params
from rlax_core.weights import IntegrityError, WeightFollower
from rlax_core.weights import manifest as mf
from rlax_core.weights.adapters import is_adapter_version, load_version, publish_adapters

MODEL = toy_config()
LORA = LoraConfig(rank=2, alpha=4.0, targets=("q", "v", "down"))


def adapters_for(seed: int):
    keys = iter(jax.random.split(jax.random.key(seed), 16))
    return jax.tree.map(lambda x: np.asarray(0.1 * jax.random.normal(next(keys), x.shape)),
                        init_adapters(MODEL, LORA, next(keys)))


def base_params(seed=0):
    return jax.tree.map(np.asarray, init_params(MODEL, jax.random.key(seed)))


def assert_tree_close(got, want, atol=1e-6):
    jax.tree.map(lambda g, w: np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=atol), got, want)


def test_follower_merges_adapter_versions_and_reads_only_the_adapters_once_it_holds_the_base(make_store):
    writer, reader = make_store(), make_store()
    base = base_params()
    writer.publish(0, base)
    manifests = {v: publish_adapters(writer, v, adapters_for(v), base_version=0, lora=LORA) for v in (1, 2)}
    assert is_adapter_version(writer, 1) and not is_adapter_version(writer, 0)
    assert manifests[1].adapter["base_checksum"] == writer.marker(0).manifest_checksum
    assert writer.marker(1).adapter_base == 0
    assert manifests[1].nbytes < writer.manifest(0).nbytes / 10

    follower = WeightFollower(reader, as_numpy=True)
    assert follower.refresh(up_to=1) and follower.version == 1 and follower.base.version == 0
    assert_tree_close(follower.params, merge(base, adapters_for(1), LORA))
    read_before = reader.counters.get("read_bytes", 0)
    assert follower.refresh() and follower.version == 2
    assert reader.counters["read_bytes"] - read_before == manifests[2].nbytes  # the adapters, not the base
    assert_tree_close(follower.take()[1], merge(base, adapters_for(2), LORA))


def test_adapter_version_whose_base_changed_is_refused_and_the_follower_keeps_its_version(make_store):
    writer, reader = make_store(), make_store()
    writer.publish(0, base_params(0))
    publish_adapters(writer, 1, adapters_for(1), base_version=0, lora=LORA)
    follower = WeightFollower(reader, as_numpy=True)
    assert follower.refresh() and follower.version == 1
    publish_adapters(writer, 2, adapters_for(2), base_version=0, lora=LORA)
    # Someone replaces version 0 under the adapters (it is immutable; only a hand on the bucket does this).
    writer.storage.delete(mf.marker_path(0))
    writer.storage.delete_tree(mf.version_dir(0))
    writer.publish(0, base_params(1))
    fresh = WeightFollower(make_store(), as_numpy=True)
    assert fresh.refresh() and fresh.version == 0  # 2 and 1 are refused; 0 itself is a sound full version
    assert set(fresh.refused) == {1, 2} and "checksum" in fresh.refused[2]
    # The first follower holds the base they pinned, byte for byte: merging version 2 into it is right.
    assert follower.refresh() and follower.version == 2
    with pytest.raises(IntegrityError, match="applies to version 0 with manifest checksum"):
        load_version(make_store(), 2)


def test_gc_keeps_the_base_while_a_kept_version_applies_to_it(make_store):
    store = make_store(keep=2, gc_grace_s=0.0)
    store.publish(0, base_params())
    for version in range(1, 5):
        publish_adapters(store, version, adapters_for(version), base_version=0, lora=LORA)
        store.gc()
    assert store.versions() == [0, 3, 4]
    store.publish(5, base_params(5))  # a new full version: the old base is no longer needed
    publish_adapters(store, 6, adapters_for(6), base_version=5, lora=LORA)
    store.gc()
    assert store.versions() == [5, 6]


def test_an_adapter_version_must_apply_to_a_full_version(make_store):
    store = make_store()
    store.publish(0, base_params())
    publish_adapters(store, 1, adapters_for(1), base_version=0, lora=LORA)
    with pytest.raises(ValueError, match="adapters apply to a full version"):
        publish_adapters(store, 2, adapters_for(2), base_version=1, lora=LORA)
