"""Fixtures of the weight-store tests: one store root per backend (a local folder and gs:// on the emulator)."""

from __future__ import annotations

import pytest

from rlax_core.weights import WeightStore, WeightStoreConfig


@pytest.fixture(params=["local", "gs"])
def store_root(request, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "weights")
    emulator = request.getfixturevalue("gcs_emulator")
    return f"{emulator.make_bucket()}/run/weights"


@pytest.fixture
def make_store(store_root):
    """``make_store(run_id="run-a", **config)`` -> a WeightStore on this test's root; closed afterwards."""
    stores = []

    def make(run_id: str = "run-a", **overrides) -> WeightStore:
        store = WeightStore(WeightStoreConfig(root=store_root, run_id=run_id, poll_interval_s=0.02, **overrides))
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()
