"""Adapter-only weight versions: a LoRA policy's version is its adapters plus the full version they apply to.

    store.publish(0, base_params)                                   # the base: an ordinary full version
    publish_adapters(store, 7, adapters, base_version=0, lora=lora) # megabytes, not the whole model
    params, base = load_policy(store, 7, held_base=base)            # merged; loads only the adapters
                                                                    # when ``base`` already holds version 0

An adapter version's manifest names its base version and pins it by the checksum of the base's
manifest (which covers every tensor checksum of the base), and holds the LoRA settings the adapters
were trained with. A reader refuses an adapter version whose base is missing, is itself an adapter
version, or no longer has the pinned checksum. The collector keeps a base as long as a kept version
applies to it (``collector.bases_needed``).

The engine takes merged weights (``lora.merge``) at the swap: a decode step then costs what the base
model's does, and merging costs one rank-r product per adapted kernel once per version.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

import jax

from rlax_core.models.lora import LoraConfig, adapted_kernels, merged_kernels, with_kernels
from rlax_core.weights.errors import IntegrityError, ManifestError, WeightStoreError
from rlax_core.weights.store import ShardingSpec, WeightStore

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class HeldBase:
    """A full version in a reader's memory that adapter versions merge into."""

    version: int
    checksum: str  # its manifest checksum (the commit marker's): what adapter versions pin
    params: Any


def adapter_reference(store: WeightStore, base_version: int, lora: LoraConfig) -> dict[str, Any]:
    """The manifest's ``adapter`` entry for adapters on ``base_version``, which must be a committed full version."""
    manifest = store.manifest(base_version)
    if manifest.adapter is not None:
        raise ValueError(f"version {base_version} is an adapter version; adapters apply to a full version")
    return {"base_version": base_version, "base_checksum": store.marker(base_version).manifest_checksum,
            "lora": lora.to_json()}


def publish_adapters(store: WeightStore, version: int, adapters: Mapping[str, Any], *, base_version: int,
                     lora: LoraConfig):
    """Publish ``adapters`` as an adapter-only ``version`` on the committed full version ``base_version``."""
    return store.publish(version, adapters, adapter=adapter_reference(store, base_version, lora))


def is_adapter_version(store: WeightStore, version: int) -> bool:
    return store.manifest(version).adapter is not None


def load_policy(store: WeightStore, version: int, *, held_base: HeldBase | None = None, dtype: Any = None,
                sharding: ShardingSpec = None, as_numpy: bool = False) -> tuple[Any, HeldBase | None]:
    """The complete policy of ``version`` and the base it was merged into (None for a full version).

    A full version loads as ``WeightStore.load`` does. An adapter version reads its adapters; its
    base comes from ``held_base`` when that is the pinned one, else from the store (and is returned,
    for the next call to pass back). ``dtype``/``sharding`` apply to the base and so to the merged
    weights; adapters are merged in float32.
    """
    try:
        manifest = store.manifest(version)
    except WeightStoreError as error:  # counted as WeightStore.load counts it
        raise store.refuse(error, version) from None
    if manifest.adapter is None:
        return store.load(version, dtype=dtype, sharding=sharding, as_numpy=as_numpy), None
    try:
        base_version = int(manifest.adapter["base_version"])
        pinned = str(manifest.adapter["base_checksum"])
        lora = LoraConfig.from_json(manifest.adapter["lora"])
    except (KeyError, TypeError, ValueError) as error:
        raise store.refuse(ManifestError(f"version {version}: unreadable adapter entry ({error})"), version) from None
    if held_base is None or held_base.version != base_version or held_base.checksum != pinned:
        found = store.marker(base_version).manifest_checksum
        if found != pinned:
            raise store.refuse(IntegrityError(
                f"adapter version {version} applies to version {base_version} with manifest checksum {pinned}, "
                f"but that version's is {found}"), version)
        if store.manifest(base_version).adapter is not None:
            raise store.refuse(ManifestError(f"adapter version {version} names adapter version {base_version} as "
                                              "its base; a base must be a full version"), version)
        held_base = HeldBase(base_version, pinned, store.load(base_version, dtype=dtype, sharding=sharding,
                                                              as_numpy=as_numpy))
        log.info("loaded base version %d for adapter version %d", base_version, version)
    adapters = store.load(version, as_numpy=True)
    # Only the adapted kernels go through the jitted merge: the other leaves stay the base's own arrays.
    kernels = _merged_kernels(adapted_kernels(held_base.params, adapters), adapters, lora.scale)
    merged = with_kernels(held_base.params, jax.device_get(kernels) if as_numpy else kernels)
    return merged, held_base


_merged_kernels = jax.jit(merged_kernels, static_argnums=2)
