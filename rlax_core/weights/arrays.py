"""Host arrays of the weight store: dtypes by name, shards into tensors, casts, placement on devices."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from rlax_core.weights.errors import IntegrityError
from rlax_core.weights.manifest import TensorRecord
from rlax_core.utils.dtypes import dtype as dtype_of
from rlax_core.utils.dtypes import is_float
from rlax_core.utils.storage import aligned_empty

# Sharding for load(): one for every tensor, a nested dict like the params, or a function of the name.
ShardingSpec = Any


def target_dtype(stored: np.dtype, requested: Any) -> np.dtype:
    """The dtype a stored tensor is loaded as: only floating tensors change dtype (token tables,
    counters and masks keep theirs)."""
    if requested is None or not is_float(stored):
        return stored
    return dtype_of(requested)


def slices_of(index: tuple[tuple[int, int], ...]) -> tuple[slice, ...]:
    return tuple(slice(start, stop) for start, stop in index)


def normalize_index(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple((s.indices(d)[0], s.indices(d)[1]) for s, d in zip(index, shape))


def assemble(tensor: TensorRecord, arrays: Mapping[str, np.ndarray], *, where: str = "") -> np.ndarray:
    """One host array from the shards of a tensor (no copy when a single shard holds all of it)."""
    if len(tensor.shards) == 1 and tensor.shards[0].shape == tensor.shape:
        return arrays[tensor.shards[0].file]
    check_coverage(tensor, where=where)
    whole = np.empty(tensor.shape, arrays[tensor.shards[0].file].dtype)
    for shard in tensor.shards:
        whole[slices_of(shard.index)] = arrays[shard.file]
    whole.setflags(write=False)
    return whole


def check_coverage(tensor: TensorRecord, *, where: str) -> None:
    """The shards of a tensor must tile it exactly once (a missing host would leave a hole)."""
    covered = sum(int(np.prod(s.shape)) for s in tensor.shards)
    if covered != int(np.prod(tensor.shape)):
        raise IntegrityError(f"{where}: shards of {tensor.name} cover {covered} of {int(np.prod(tensor.shape))} elements")


def cast(array: np.ndarray, dtype: Any) -> np.ndarray:
    target = target_dtype(array.dtype, dtype)
    if array.dtype == target:
        return array
    # 64-byte aligned, so that jax.device_put on CPU adopts it instead of copying it once more.
    out = aligned_empty(array.size * target.itemsize).view(target).reshape(array.shape)
    np.copyto(out, array, casting="unsafe")
    out.setflags(write=False)
    return out


def place(flat: dict[str, np.ndarray], sharding: ShardingSpec) -> dict[str, Any]:
    """Host arrays -> jax arrays placed by ``sharding`` (see ``WeightStore.load``)."""
    import jax

    if sharding is None:
        return {name: jax.device_put(array) for name, array in flat.items()}
    if isinstance(sharding, jax.sharding.Sharding):
        return {name: jax.device_put(array, sharding) for name, array in flat.items()}
    if callable(sharding):
        return {name: jax.device_put(array, sharding(name)) for name, array in flat.items()}
    if isinstance(sharding, Mapping):
        per_name = _flatten_shardings(sharding)
        missing = sorted(set(flat) - set(per_name))
        if missing:
            raise ValueError(f"load: no sharding given for {missing[:3]}{'...' if len(missing) > 3 else ''}")
        return {name: jax.device_put(array, per_name[name]) for name, array in flat.items()}
    raise TypeError(f"sharding must be a Sharding, a nested dict of them, a function of the name, or None; "
                    f"got {type(sharding).__name__}")


def _flatten_shardings(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        flat.update(_flatten_shardings(value, name) if isinstance(value, Mapping) else {name: value})
    return flat
