"""Sharded writes (each host its shards), loads into another sharding and dtype, the async publisher."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlax_core.config import ConfigError, from_dict
from rlax_core.weights import AsyncPublisher, IntegrityError, WeightStore, WeightStoreConfig, is_fresh_enough
from rlax_core.weights.staleness import oldest_fresh_version
from tests.weights.versioned_params import assert_is_version, params_for


def _fsdp_params(version: int):
    """Trainer layout: float32, every tensor's first axis sharded over 8 devices (fsdp)."""
    mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
    return {
        "wq": jax.device_put(jnp.arange(64 * 16, dtype=jnp.float32).reshape(64, 16) + version, NamedSharding(mesh, P("fsdp", None))),
        "embed": jax.device_put(jnp.full((32, 8), float(version)), NamedSharding(mesh, P("fsdp", None))),
        "norm": jax.device_put(jnp.ones((16,)) * version, NamedSharding(mesh, P())),  # replicated: written once
    }


def test_sharded_write_loads_replicated_bfloat16_and_tensor_parallel(make_store):
    store = make_store()
    params = _fsdp_params(2)
    manifest = store.publish(2, params)
    shards = {t.name: t.shards for t in manifest.tensors}
    assert len(shards["wq"]) == 8 and shards["wq"][3].index == ((24, 32), (0, 16))
    assert len(shards["norm"]) == 1

    replicated = store.load(2, dtype="bfloat16", sharding=NamedSharding(Mesh(np.array(jax.devices()[:4]), ("x",)), P()))
    assert replicated["wq"].dtype == jnp.bfloat16 and replicated["wq"].sharding.is_fully_replicated
    np.testing.assert_array_equal(np.asarray(replicated["embed"], np.float32), np.full((32, 8), 2.0))

    tp_mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "tensor"))
    tensor_parallel = {"wq": NamedSharding(tp_mesh, P(None, "tensor")), "embed": NamedSharding(tp_mesh, P("tensor", None)),
                       "norm": NamedSharding(tp_mesh, P())}
    loaded = store.load(2, sharding=tensor_parallel)
    assert loaded["wq"].sharding == tensor_parallel["wq"]
    for name in params:
        np.testing.assert_array_equal(np.asarray(loaded[name]), np.asarray(params[name]))


def test_two_hosts_each_write_their_shards_and_host_0_commits(tmp_path):
    config = WeightStoreConfig(root=str(tmp_path), run_id="run-a", poll_interval_s=0.02, commit_timeout_s=30)
    params = _fsdp_params(4)
    results = {}

    def host(index: int) -> None:
        with WeightStore(config) as store:  # devices 0-3 live on host 0, devices 4-7 on host 1
            results[index] = store.publish(4, params, process_index=index, process_count=2,
                                           owns_shard=lambda s: s.replica_id == 0 and (s.device.id >= 4) == bool(index))

    threads = [threading.Thread(target=host, args=(i,)) for i in (1, 0)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert results[1] is None and len({s.file for s in next(t for t in results[0].tensors if t.name == "wq").shards}) == 8
    with WeightStore(config) as reader:
        loaded = reader.load(4, as_numpy=True)
    for name in params:
        np.testing.assert_array_equal(loaded[name], np.asarray(params[name]))


def test_host_0_fails_loudly_when_another_host_never_writes(tmp_path):
    config = WeightStoreConfig(root=str(tmp_path), run_id="run-a", poll_interval_s=0.02, commit_timeout_s=0.3)
    with WeightStore(config) as store:
        with pytest.raises(TimeoutError, match="part-00001.json"):
            store.publish(1, params_for(1), process_index=0, process_count=2)
        assert store.latest() is None


def test_shards_that_do_not_cover_a_tensor_are_refused(tmp_path):
    config = WeightStoreConfig(root=str(tmp_path), run_id="run-a", poll_interval_s=0.02, commit_timeout_s=5)
    params = _fsdp_params(1)
    with WeightStore(config) as store:
        store.publish(1, params, process_index=1, process_count=2, owns_shard=lambda s: s.device.id == 5)
        with pytest.raises(IntegrityError, match="cover"):
            store.publish(1, params, process_index=0, process_count=2, owns_shard=lambda s: s.device.id == 0)


# ---------------------------------------------------------------------- the trainer's asynchronous publisher


class GatedStore(WeightStore):
    """A real store whose writes wait for a gate, so the test decides when storage is slow."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gate, self.started = threading.Event(), threading.Event()

    def publish(self, version, params, **kwargs):
        self.started.set()
        assert self.gate.wait(timeout=30), "test gate never opened"
        return super().publish(version, params, **kwargs)


def test_newer_submit_supersedes_the_waiting_one_and_memory_stays_bounded(tmp_path):
    store = GatedStore(WeightStoreConfig(root=str(tmp_path), run_id="run-a"))
    with AsyncPublisher(store) as publisher:
        publisher.submit(1, params_for(1))
        assert store.started.wait(timeout=10)  # version 1 is in flight, blocked on storage
        publisher.submit(2, params_for(2))
        publisher.submit(3, params_for(3))  # replaces 2, which never started
        assert publisher.superseded == 1
        store.gate.set()
        assert publisher.flush(timeout_s=30) == 3
    assert store.versions() == [1, 3]
    assert_is_version(store.load(3, as_numpy=True), 3)
    store.close()


@pytest.mark.parametrize("ready", [True, False], ids=["ready-pinned", "in-flight-copied"])
def test_params_donated_right_after_submit_are_published_intact(tmp_path, ready):
    store = WeightStore(WeightStoreConfig(root=str(tmp_path), run_id="run-a", publish_dtype="bfloat16"))
    step = jax.jit(lambda p: jax.tree.map(lambda x: x * 0 - 1, p), donate_argnums=0)
    make = jax.jit(lambda v: jax.tree.map(lambda x: x + v, _fsdp_params(0)))
    expected = {k: np.asarray(v) for k, v in make(3).items()}
    params = make(3)
    if ready:
        jax.block_until_ready(params)
    with AsyncPublisher(store) as publisher:
        publisher.submit(3, params)
        params = step(params)  # the trainer's next step reuses (donates) the buffers at once
        jax.block_until_ready(params)
        publisher.flush(timeout_s=30)
    loaded = store.load(3, dtype="float32", as_numpy=True)
    assert store.manifest(3).tensors[0].dtype == "bfloat16"
    for name in expected:
        np.testing.assert_array_equal(loaded[name], expected[name].astype(jnp.bfloat16).astype(np.float32))
    store.close()


def _float32_weights_with_every_rounding_case(shape, seed: int) -> np.ndarray:
    """Normal weights, plus what a float32 -> bfloat16 cast can get wrong: ties (to even, both ways),
    NaN payloads, infinities, -0.0, subnormals, overflow to infinity."""
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32).reshape(-1) * 0.02
    cases = np.array([0x3F808000, 0x3F818000, 0x7FC00001, 0xFFC12345, 0x7F800000, 0xFF800000, 0x80000000,
                      0x00000001, 0x807FFFFF, 0x7F7FFFFF], np.uint32).view(np.float32)
    values[:cases.size] = cases
    values[-cases.size:] = cases  # and again in the last of several cast chunks
    return values.reshape(shape)


@pytest.mark.parametrize("source", ["jax-cpu", "numpy"])
def test_bfloat16_publish_loads_exactly_the_cast_of_the_float32_weights(make_store, source):
    from rlax_core.weights.delta import CHUNK_ELEMENTS

    rows = 2 * CHUNK_ELEMENTS // 1024 + 8  # spans three cast chunks; divisible by the 8 devices
    weights = {"big": _float32_weights_with_every_rounding_case((rows, 1024), 0),
               "small": _float32_weights_with_every_rounding_case((3, 5), 1), "step": np.array([7], np.int32)}
    if source == "jax-cpu":  # the trainer's arrays: pinned, cast chunk by chunk by the publisher (one per shard)
        mesh = Mesh(np.array(jax.devices()[:8]), ("fsdp",))
        params = {"big": jax.device_put(weights["big"], NamedSharding(mesh, P("fsdp", None))),
                  "small": jnp.asarray(weights["small"]), "step": jnp.asarray(weights["step"])}
        jax.block_until_ready(params)
    else:
        params = weights
    store = make_store(publish_dtype="bfloat16")
    with AsyncPublisher(store) as publisher:
        publisher.submit(1, params)
        publisher.flush(timeout_s=60)
    for loaded in (make_store().load(1, as_numpy=True), make_store().load(1, dtype="bfloat16")):
        for name in ("big", "small"):
            cast_by_ml_dtypes = weights[name].astype(jnp.bfloat16)
            cast_by_xla = np.asarray(jnp.asarray(weights[name]).astype(jnp.bfloat16))
            assert np.asarray(loaded[name]).dtype == jnp.bfloat16
            assert np.asarray(loaded[name]).tobytes() == cast_by_ml_dtypes.tobytes() == cast_by_xla.tobytes(), name
        assert np.asarray(loaded["step"]).dtype == np.int32 and int(loaded["step"][0]) == 7


def test_a_failed_publication_surfaces_on_the_next_submit(tmp_path):
    store = WeightStore(WeightStoreConfig(root=str(tmp_path), run_id="run-a"))
    with AsyncPublisher(store) as publisher:
        publisher.submit(1, {"bad key/with slash": np.zeros(2)})
        with pytest.raises(RuntimeError, match="earlier weight publication failed"):
            publisher.flush(timeout_s=30)
    store.close()


# ---------------------------------------------------------------------- staleness and config


@pytest.mark.parametrize("rollout_version, train_step, max_staleness, fresh", [
    (10, 10, 0, True), (9, 10, 0, False), (8, 10, 2, True), (7, 10, 2, False), (11, 10, 2, False), (0, 0, 0, True),
])
def test_staleness_rule(rollout_version, train_step, max_staleness, fresh):
    assert is_fresh_enough(rollout_version, train_step, max_staleness) is fresh


def test_staleness_rule_rejects_nonsense():
    with pytest.raises(ValueError, match="max_staleness"):
        is_fresh_enough(1, 2, -1)
    assert oldest_fresh_version(10, 3) == 7 and oldest_fresh_version(1, 3) == 0


def test_config_loads_from_dict_and_reports_bad_values():
    config = from_dict(WeightStoreConfig, {"root": "gs://b/w", "run_id": "r1", "publish_dtype": "bfloat16", "keep": 3})
    assert config.keep == 3 and config.publish_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="weights.keep: at least 1"):
        from_dict(WeightStoreConfig, {"root": "/tmp/w", "run_id": "r", "keep": 0}, path="weights")
    with pytest.raises(ConfigError, match="publish_dtype"):
        from_dict(WeightStoreConfig, {"root": "/tmp/w", "run_id": "r", "publish_dtype": "int8"})
    with pytest.raises(ConfigError, match="root"):
        from_dict(WeightStoreConfig, {"root": "s3://b/w", "run_id": "r"})
