"""The parameter server: versioned weight store, asynchronous publisher, follower, staleness rule.

    store = WeightStore(WeightStoreConfig(root="gs://bucket/run1/weights", run_id="run1"))
    publisher = AsyncPublisher(store)            # trainer
    publisher.submit(step, params)               #   returns after dispatching a copy
    follower = WeightFollower(store, dtype="bfloat16", sharding=engine_sharding)   # evaluation, exports
    follower.refresh(); follower.params, follower.version
    follower = WeightFollower(store, dtype="bfloat16", merge_adapters=False)      # rollout worker
    if follower.refresh(): follower.hand_to(engine)    # a LoRA version's adapters alone on the engine's base
"""

from rlax_core.utils.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ["WeightStoreConfig"],
    "errors": [
        "ForeignRunError", "IntegrityError", "ManifestError", "StorageTimeoutError", "VersionExistsError",
        "VersionNotCommittedError", "WeightStoreError",
    ],
    "follower": ["WeightFollower"],
    "manifest": ["CommitMarker", "Manifest"],
    "publisher": ["AsyncPublisher", "stage_params"],
    "staleness": ["is_fresh_enough", "oldest_fresh_version"],
    "store": ["WeightStore"],
})
