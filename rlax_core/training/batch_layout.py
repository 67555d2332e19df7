"""How a trainer's batches are laid out over its mesh: rows per device, mini- and micro-batch, packed
rows (``packing``), and the host -> device placement; the same for every training objective."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from rlax_core.parallel.mesh import BATCH_AXES, batch_sharding
from rlax_core.training.batching import RoutedExperts, batch_shapes
from rlax_core.training.config import TrainerConfig
from rlax_core.training.packing import pack_batch, packed_batch_shapes


class BatchLayout:
    def __init__(self, config: TrainerConfig, mesh: Mesh, *, pad_id: int = 0, routed: RoutedExperts | None = None):
        self.config, self.mesh, self.pad_id, self.routed = config, mesh, pad_id, routed
        self.batch_shards = int(np.prod([mesh.shape[a] for a in BATCH_AXES]))
        self.row_multiple = self.batch_shards * config.mini_batches * config.micro_batches
        # Each device's part of each micro-batch: a packed batch gives every lane the same rows (packing.py).
        # With trainer.micro_batch_tokens a lane holds that many tokens' rows and the micro-batches
        # are as many as a batch's tokens take (bucketed): ``micro_batches_of(batch)``.
        self.lanes = self.row_multiple
        self.rows_per_micro_batch = config.micro_batch_tokens // config.row_tokens if config.micro_batch_tokens else None

    def pack(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``make_batch``'s padded batch as this trainer steps on it: packed into rows of
        ``trainer.row_tokens`` (``training.packing``), or as it is when that is 0."""
        config = self.config
        if not config.row_tokens:
            return batch
        lanes = None if self.rows_per_micro_batch else self.lanes
        return pack_batch(batch, row_tokens=config.row_tokens, lanes=lanes, devices=self.batch_shards,
                          rows_per_lane=self.rows_per_micro_batch, lane_multiple=self.batch_shards * config.mini_batches,
                          per_octave=config.row_buckets_per_octave, pad_id=self.pad_id)

    def micro_batches_of(self, batch) -> int:
        """The micro-batches of each slice of ``batch``: ``trainer.micro_batches``, or with
        ``trainer.micro_batch_tokens`` as many as its packed rows fill."""
        if self.rows_per_micro_batch and "sample_row" in batch:
            return batch["tokens"].shape[0] // (self.rows_per_micro_batch * self.batch_shards * self.config.mini_batches)
        return self.config.micro_batches

    def lanes_of(self, batch) -> int:
        return self.batch_shards * self.config.mini_batches * self.micro_batches_of(batch)

    def put(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Host arrays -> global arrays split over the batch axes (each process supplies its own rows)."""
        multiple = self.lanes_of(batch)
        for name, x in batch.items():
            if np.shape(x)[0] % multiple:
                raise ValueError(f"batch array {name} of {np.shape(x)[0]} rows does not split into {self.batch_shards} "
                                 f"device shards x {self.config.mini_batches} mini-batches x "
                                 f"{self.config.micro_batches} micro-batches; pad it with make_batch(row_multiple="
                                 "trainer.row_multiple) or pack it with pack_batch(lanes=trainer.lanes)")

        def put(x):
            sharding = batch_sharding(self.mesh, x.ndim)
            return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

        return {name: put(np.asarray(x)) for name, x in batch.items()}

    def abstract(self, rollouts: int, mean_tokens: int | None = None, per_sample: tuple[str, ...] = ()) -> dict[str, Any]:
        """The batch of ``rollouts`` samples as shapes with their shardings (``Trainer.lower_step``): packed
        from samples of ``mean_tokens`` (default: half of max_seq_len) with ``trainer.row_tokens``;
        ``per_sample``: further float32 arrays of one value per sample slot."""
        config = self.config
        if config.row_tokens:
            shapes = packed_batch_shapes(
                rollouts, mean_tokens or config.max_seq_len // 2, max_seq_len=config.max_seq_len,
                row_tokens=config.row_tokens, lanes=None if self.rows_per_micro_batch else self.lanes,
                rows_per_lane=self.rows_per_micro_batch, lane_multiple=self.batch_shards * config.mini_batches,
                per_octave=config.row_buckets_per_octave, routed=self.routed)
        else:
            shapes = batch_shapes(rollouts, max_seq_len=config.max_seq_len, row_multiple=self.row_multiple,
                                  routed=self.routed)
        shapes.update({name: (shapes["sample_mask"][0], np.float32) for name in per_sample})
        return {name: jax.ShapeDtypeStruct(shape, dtype, sharding=batch_sharding(self.mesh, len(shape)))
                for name, (shape, dtype) in shapes.items()}
