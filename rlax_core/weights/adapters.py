"""Adapter-only weight versions: a LoRA policy's version is its adapters plus the full version they apply to.

    store.publish(0, base_params)                                   # the base: an ordinary full version
    publish_adapters(store, 7, adapters, base_version=0, lora=lora) # megabytes, not the whole model
    params, base = load_version(store, 7, held_base=base)            # merged; loads only the adapters
                                                                    # when ``base`` already holds version 0

An adapter version's manifest names its base version and pins it by the checksum of the base's
manifest (which covers every tensor checksum of the base), and holds the LoRA settings the adapters
were trained with. A reader refuses an adapter version whose base is missing, is itself an adapter
version, or no longer has the pinned checksum. The collector keeps a base as long as a kept version
applies to it (``collector.bases_needed``).

``load_version`` returns merged weights (``lora.merge``): what evaluation, exports and a follower that
merges take. ``load_parts`` returns what changed instead, for a reader whose engine holds the base
and applies adapters itself (``WeightFollower(merge_adapters=False)``, ``Engine.update_adapters``):
an adapter version on the base it holds costs it the adapters' bytes only.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Mapping

import jax

from rlax_core.models.lora import adapted_kernels, merged_kernels, with_kernels
from rlax_core.models.lora_config import LoraConfig
from rlax_core.weights.errors import IntegrityError, ManifestError, WeightStoreError
from rlax_core.weights.store import ShardingSpec, WeightStore

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BaseKey:
    """A full version as adapter versions pin it: its number and its manifest's checksum."""

    version: int
    checksum: str


@dataclasses.dataclass(frozen=True)
class HeldBase:
    """A full version in a reader's memory that adapter versions merge into."""

    version: int
    checksum: str  # its manifest checksum (the commit marker's): what adapter versions pin
    params: Any

    @property
    def key(self) -> BaseKey:
        return BaseKey(self.version, self.checksum)


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


@dataclasses.dataclass(frozen=True)
class VersionParts:
    """What a reader that holds the base ``held`` must take in to reach ``version``.

    A full version: ``params`` are its weights (the reader's new base). An adapter version:
    ``adapters`` and ``lora``, on ``base``; ``params`` is that base's weights when the reader did not
    hold it, else None (the reader applies the adapters to the base it holds).
    """

    version: int
    base: BaseKey  # the full version the reader holds once it has taken these parts in
    params: Any = None
    adapters: Any = None
    lora: LoraConfig | None = None


def load_parts(store: WeightStore, version: int, *, held: BaseKey | None = None, dtype: Any = None,
               sharding: ShardingSpec = None, as_numpy: bool = False) -> VersionParts:
    """``version``'s parts for a reader holding the base ``held`` (None: nothing): a full version
    whole; an adapter version's adapters (float32 on the host), and its base too unless ``held`` is
    the pinned one. ``dtype``/``sharding``/``as_numpy`` apply to full weights, as in ``WeightStore.load``.
    Refuses (``WeightStore.refuse``) an adapter version whose base is missing, changed, or itself adapters.
    """
    try:
        manifest, checksum = store.manifest(version), store.marker(version).manifest_checksum
    except WeightStoreError as error:  # counted as WeightStore.load counts it
        raise store.refuse(error, version) from None
    if manifest.adapter is None:
        return VersionParts(version, BaseKey(version, checksum),
                            params=store.load(version, dtype=dtype, sharding=sharding, as_numpy=as_numpy))
    try:
        key = BaseKey(int(manifest.adapter["base_version"]), str(manifest.adapter["base_checksum"]))
        lora = LoraConfig.from_json(manifest.adapter["lora"])
    except (KeyError, TypeError, ValueError) as error:
        raise store.refuse(ManifestError(f"version {version}: unreadable adapter entry ({error})"), version) from None
    base_params = None
    if held != key:
        found = store.marker(key.version).manifest_checksum
        if found != key.checksum:
            raise store.refuse(IntegrityError(
                f"adapter version {version} applies to version {key.version} with manifest checksum {key.checksum}, "
                f"but that version's is {found}"), version)
        if store.manifest(key.version).adapter is not None:
            raise store.refuse(ManifestError(f"adapter version {version} names adapter version {key.version} as "
                                              "its base; a base must be a full version"), version)
        base_params = store.load(key.version, dtype=dtype, sharding=sharding, as_numpy=as_numpy)
        log.info("loaded base version %d for adapter version %d", key.version, version)
    return VersionParts(version, key, params=base_params, adapters=store.load(version, as_numpy=True), lora=lora)


def load_version(store: WeightStore, version: int, *, held_base: HeldBase | None = None, dtype: Any = None,
                sharding: ShardingSpec = None, as_numpy: bool = False) -> tuple[Any, HeldBase | None]:
    """The complete policy of ``version`` and the base it was merged into (None for a full version).

    A full version loads as ``WeightStore.load`` does. An adapter version reads its adapters; its
    base comes from ``held_base`` when that is the pinned one, else from the store (and is returned,
    for the next call to pass back). ``dtype``/``sharding`` apply to the base and so to the merged
    weights; adapters are merged in float32.
    """
    parts = load_parts(store, version, held=None if held_base is None else held_base.key, dtype=dtype,
                       sharding=sharding, as_numpy=as_numpy)
    if parts.adapters is None:
        return parts.params, None
    if parts.params is not None:
        held_base = HeldBase(parts.base.version, parts.base.checksum, parts.params)
    return merge_into(held_base.params, parts.adapters, parts.lora, as_numpy=as_numpy), held_base


def merge_into(base: Any, adapters: Any, lora: LoraConfig, *, as_numpy: bool = False) -> Any:
    """``base`` with ``adapters`` merged; only the adapted kernels go through the jitted merge, the
    other leaves stay the base's own arrays."""
    kernels = _merged_kernels(adapted_kernels(base, adapters), adapters, lora.scale)
    return with_kernels(base, jax.device_get(kernels) if as_numpy else kernels)


_merged_kernels = jax.jit(merged_kernels, static_argnums=2)
