"""The parameter server: versioned weight store, asynchronous publisher, follower, staleness rule.

    store = WeightStore(WeightStoreConfig(root="gs://bucket/run1/weights", run_id="run1"))
    publisher = AsyncPublisher(store)            # trainer
    publisher.submit(step, params)               #   returns after dispatching a copy
    follower = WeightFollower(store, dtype="bfloat16", sharding=engine_sharding)   # evaluation, exports
    follower.refresh(); follower.params, follower.version
    follower = WeightFollower(store, dtype="bfloat16", merge_adapters=False)      # rollout worker
    if follower.refresh(): follower.hand_to(engine)    # a LoRA version's adapters alone on the engine's base
"""

from rlax_core.weights.config import WeightStoreConfig
from rlax_core.weights.errors import (
    ForeignRunError,
    IntegrityError,
    ManifestError,
    StorageTimeoutError,
    VersionExistsError,
    VersionNotCommittedError,
    WeightStoreError,
)
from rlax_core.weights.follower import WeightFollower
from rlax_core.weights.manifest import CommitMarker, Manifest
from rlax_core.weights.publisher import AsyncPublisher, stage_params
from rlax_core.weights.staleness import is_fresh_enough, oldest_fresh_version
from rlax_core.weights.store import WeightStore

__all__ = [
    "AsyncPublisher", "CommitMarker", "ForeignRunError", "IntegrityError", "Manifest", "ManifestError",
    "StorageTimeoutError", "VersionExistsError", "VersionNotCommittedError", "WeightFollower", "WeightStore",
    "WeightStoreConfig", "WeightStoreError", "is_fresh_enough", "oldest_fresh_version", "stage_params",
]
