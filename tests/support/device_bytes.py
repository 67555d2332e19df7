"""What a device holds of some arrays, for tests that check a plan against what JAX placed."""


def bytes_on(device, arrays) -> int:
    """Bytes of ``arrays``' shards that live on ``device``."""
    return sum(shard.data.nbytes for array in arrays for shard in array.addressable_shards if shard.device == device)
