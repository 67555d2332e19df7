"""Samples packed into rows of ``trainer.row_tokens``: the update computes on tokens, not padding.

A padded batch (``batching.make_batch``) gives every sample a row of ``max_seq_len`` tokens; where
the mean sample is a quarter of the cap, three quarters of the forward and backward pass is padding.
``pack_batch`` places the same samples back to back in rows of ``row_tokens`` tokens instead:

* **rows** (what the model runs on): ``tokens``, ``segment_ids`` (1, 2, ... the samples of a row, 0
  padding: attention stays inside a segment) and ``positions`` (restarting at 0 in each segment),
  all [R, row_tokens], and a mixture of experts' ``routed_experts`` [R, row_tokens, moe_layers, k]
  (each token's recorded experts beside it; expert 0 in padding);
* **samples** (what the objective reads, exactly as padded): ``loss_mask``, ``behavior_logprobs``
  [S, max_seq_len - 1] and ``rewards``, ``group_ids``, ``sample_mask``, ``policy_versions`` [S],
  with ``sample_row`` and ``sample_offset`` [S]: where each sample starts among its lane's rows.

The trainer runs the model on the rows and reads each sample's per-token results back into the
sample layout (``rows_to_samples``: one gather), so advantages, every loss aggregation, the KL,
entropy, importance and mismatch weights, the value loss and every metric see exactly the arrays
of the padded batch. This is how verl keeps its losses exact when it removes padding (the
model runs unpadded, log-probs are padded back); the sample arrays are a few floats per token, the
model's activations are thousands.

**Lanes.** The update splits a batch over ``lanes = data shards x mini_batches x micro_batches``
(``Trainer.lanes``): each lane is one device's part of one micro-batch. Samples go to rows by first
fit decreasing; rows go to lanes by tokens (the least-loaded lane with room), so no device waits on
another. Every lane has the same number of rows and sample slots, rounded up to a bucket
(``bucket``: a few sizes per octave), so that the update compiles once per bucket rather than once
per step. Lane ``c`` of device ``d`` holds global rows ``d * lanes_per_device * r + i * C + c``
(the same for sample slots): the order ``micro_batches.split_micro_batches`` and the batch's
sharding cut it back into lanes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import jax
import jax.numpy as jnp
import numpy as np

# What the model reads of a batch: its rows, and where each sample sits in them when packed.
MODEL_INPUTS = ("tokens", "attention_mask", "segment_ids", "positions", "sample_row", "sample_offset",
                "routed_experts")
# Arrays per token that travel with the tokens into packed rows (the others are per sample).
TOKEN_ARRAYS = ("tokens", "attention_mask", "routed_experts")


@dataclasses.dataclass(frozen=True)
class LaneShape:
    """Rows and sample slots per lane of a packed batch (static: the update's shapes)."""

    rows: int
    samples: int


def bucket(count: int, per_octave: int) -> int:
    """The smallest size >= ``count`` of the form ceil(2 ** (k / per_octave)): at most a
    ``2 ** (1 / per_octave) - 1`` share of padding rows, and ``per_octave`` compiled shapes per doubling."""
    if count <= 1:
        return 1
    k = math.floor(per_octave * math.log2(count))
    while math.ceil(2 ** (k / per_octave) - 1e-9) < count:
        k += 1
    return max(count, math.ceil(2 ** (k / per_octave) - 1e-9))


def pack_batch(batch: Mapping[str, np.ndarray], *, row_tokens: int, lanes: int | None = None, devices: int = 1,
               rows_per_lane: int | None = None, lane_multiple: int = 1, per_octave: int = 8,
               pad_id: int = 0) -> dict[str, np.ndarray]:
    """The packed form of a padded batch (``make_batch``'s arrays): see the module docstring.

    Either ``lanes`` (data shards x mini-batches x micro-batches: the rows per lane follow the
    tokens, bucketed) or ``rows_per_lane`` (``trainer.micro_batch_tokens``: the micro-batches
    follow the tokens, their count bucketed, the lanes a multiple of ``lane_multiple`` = data shards
    x mini-batches). ``devices``: the data shards, a divisor of the lanes. A sample longer than
    ``row_tokens`` raises a ``ValueError``.
    """
    lengths = np.asarray(batch["attention_mask"]).sum(axis=1).astype(np.int64)
    real = np.flatnonzero((np.asarray(batch["sample_mask"]) > 0) & (lengths > 0))
    if len(real) and lengths[real].max() > row_tokens:
        longest = int(real[np.argmax(lengths[real])])
        raise ValueError(f"a sample of {lengths[longest]} tokens does not fit a row of trainer.row_tokens={row_tokens}")
    row_of, offset_of, fill = _first_fit_decreasing(lengths, real, row_tokens)
    if (lanes is None) == (rows_per_lane is None):
        raise ValueError("pack_batch takes lanes or rows_per_lane, one of them")
    if lanes is None:  # micro-batches by tokens: as many as the rows need, bucketed
        lanes = lane_multiple * bucket(max(1, -(-len(fill) // (lane_multiple * rows_per_lane))), per_octave)
    if lanes % devices:
        raise ValueError(f"{lanes} lanes do not split over {devices} devices")
    shape, lane_of_row, slot_of_row = _rows_to_lanes(fill, row_of[real], lanes, per_octave, rows_per_lane)

    chunks = lanes // devices
    packed = {"tokens": np.full((lanes * shape.rows, row_tokens), pad_id, np.int32),
              "segment_ids": np.zeros((lanes * shape.rows, row_tokens), np.int32),
              "positions": np.zeros((lanes * shape.rows, row_tokens), np.int32)}
    if "routed_experts" in batch:
        packed["routed_experts"] = np.zeros((lanes * shape.rows, row_tokens, *batch["routed_experts"].shape[2:]),
                                            batch["routed_experts"].dtype)
    sample_names = [name for name in batch if name not in TOKEN_ARRAYS]
    for name in sample_names:
        fill_value = -1 if name == "group_ids" else 0
        packed[name] = np.full((lanes * shape.samples, *batch[name].shape[1:]), fill_value, batch[name].dtype)
    packed["sample_row"] = np.zeros(lanes * shape.samples, np.int32)
    packed["sample_offset"] = np.zeros(lanes * shape.samples, np.int32)

    def global_index(lane, i, per_lane):  # lane = device * chunks + chunk; see the module docstring
        device, chunk = divmod(lane, chunks)
        return device * chunks * per_lane + i * chunks + chunk

    samples_in_lane = np.zeros(lanes, np.int64)
    segments_in_row = np.zeros(len(fill), np.int64)
    for sample in real[np.lexsort((offset_of[real], row_of[real]))]:  # each row's samples in order
        row, offset, length = row_of[sample], offset_of[sample], lengths[sample]
        lane = lane_of_row[row]
        target_row = global_index(lane, slot_of_row[row], shape.rows)
        segments_in_row[row] += 1
        packed["tokens"][target_row, offset:offset + length] = batch["tokens"][sample, :length]
        packed["segment_ids"][target_row, offset:offset + length] = segments_in_row[row]
        packed["positions"][target_row, offset:offset + length] = np.arange(length)
        if "routed_experts" in batch:
            packed["routed_experts"][target_row, offset:offset + length] = batch["routed_experts"][sample, :length]
        slot = global_index(lane, samples_in_lane[lane], shape.samples)
        samples_in_lane[lane] += 1
        for name in sample_names:
            packed[name][slot] = batch[name][sample]
        packed["sample_row"][slot], packed["sample_offset"][slot] = slot_of_row[row], offset
    return packed


def _first_fit_decreasing(lengths, real, row_tokens):
    """Each real sample's row and offset, and each row's tokens: the longest first, each into the
    first row with room (the rule within 11/9 of the fewest rows)."""
    row_of, offset_of = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
    fill = np.zeros(len(real), np.int64)  # at most one row per sample
    rows = 0
    for sample in real[np.argsort(-lengths[real], kind="stable")]:
        room = np.flatnonzero(fill[:rows] + lengths[sample] <= row_tokens)
        row = int(room[0]) if len(room) else rows
        rows = max(rows, row + 1)
        row_of[sample], offset_of[sample] = row, fill[row]
        fill[row] += lengths[sample]
    return row_of, offset_of, fill[:rows]


def _rows_to_lanes(fill, rows_of_samples, lanes, per_octave, rows_per_lane=None):
    """The lanes' (bucketed) shape, and each row's lane and slot in it: the fullest rows first, each
    to the lane with the fewest tokens that has room, so that the lanes' tokens balance."""
    rows_per_lane = rows_per_lane or bucket(max(1, -(-len(fill) // lanes)), per_octave)
    tokens, count = np.zeros(lanes, np.int64), np.zeros(lanes, np.int64)
    lane_of_row, slot_of_row = np.zeros(len(fill), np.int64), np.zeros(len(fill), np.int64)
    for row in np.argsort(-fill, kind="stable"):
        lane = int(np.argmin(np.where(count < rows_per_lane, tokens, np.iinfo(np.int64).max)))
        lane_of_row[row], slot_of_row[row] = lane, count[lane]
        tokens[lane] += fill[row]
        count[lane] += 1
    samples_per_lane = np.bincount(lane_of_row[rows_of_samples], minlength=lanes)
    shape = LaneShape(rows=rows_per_lane, samples=bucket(max(1, int(samples_per_lane.max(initial=0))), per_octave))
    return shape, lane_of_row, slot_of_row


def packed_batch_shapes(rollouts: int, mean_tokens: int, *, max_seq_len: int, row_tokens: int,
                        lanes: int | None = None, rows_per_lane: int | None = None, lane_multiple: int = 1,
                        per_octave: int = 8, routed=None) -> dict[str, tuple[tuple[int, ...], type]]:
    """(shape, dtype) of each array of the batch ``pack_batch`` would build from ``rollouts``
    samples of ``mean_tokens`` tokens on average (rows filled whole: a bound from below, and what
    ``rlax compile`` lowers for a packed trainer; ``lanes``/``rows_per_lane`` as ``pack_batch``;
    ``routed``: a mixture of experts' ``batching.RoutedExperts``)."""
    rows = max(1, -(-rollouts * min(mean_tokens, max_seq_len) // row_tokens))
    if lanes is None:
        lanes = lane_multiple * bucket(-(-rows // (lane_multiple * rows_per_lane)), per_octave)
    rows_per_lane = rows_per_lane or bucket(-(-rows // lanes), per_octave)
    slots = lanes * bucket(-(-rollouts // lanes), per_octave)
    T = max_seq_len
    routing = {} if routed is None else {"routed_experts": (
        (lanes * rows_per_lane, row_tokens, routed.moe_layers, routed.experts_per_token), np.dtype(routed.dtype))}
    return {**routing, "tokens": ((lanes * rows_per_lane, row_tokens), np.int32),
            "segment_ids": ((lanes * rows_per_lane, row_tokens), np.int32),
            "positions": ((lanes * rows_per_lane, row_tokens), np.int32),
            "loss_mask": ((slots, T - 1), np.float32), "behavior_logprobs": ((slots, T - 1), np.float32),
            "rewards": ((slots,), np.float32), "group_ids": ((slots,), np.int32), "sample_mask": ((slots,), np.float32),
            "policy_versions": ((slots,), np.int32), "sample_row": ((slots,), np.int32),
            "sample_offset": ((slots,), np.int32)}


def lane_shape(batch: Mapping[str, jax.Array], lanes: int) -> LaneShape | None:
    """The lanes' shape of a packed batch; None for a padded one (its rows are its samples)."""
    if "sample_row" not in batch:
        return None
    return LaneShape(rows=batch["tokens"].shape[0] // lanes, samples=batch["sample_row"].shape[0] // lanes)


def rows_to_samples(values: jax.Array, arrays: Mapping[str, jax.Array], shape: LaneShape | None,
                    width: int) -> jax.Array:
    """Per-position results of packed rows [rows, L - 1] -> each sample's [samples, width], as the
    padded batch holds them (position t of a sample: its token t predicting t + 1).

    ``arrays`` is the batch or any part of it cut along lanes (a micro-batch, one device's share):
    its ``sample_row`` counts rows from its lane's first, and lane k of ``arrays`` holds sample slots
    ``k * shape.samples ...`` and rows ``k * shape.rows ...``. Positions past a sample's end read its
    neighbours' results; the sample's mask is 0 there. A padded batch's ``values`` pass unchanged.
    """
    if shape is None:
        return values
    slots, row_width = arrays["sample_row"].shape[0], values.shape[1]
    row = arrays["sample_row"] + (jnp.arange(slots, dtype=jnp.int32) // shape.samples) * shape.rows
    start = row * row_width + arrays["sample_offset"]
    return jnp.take(values.reshape(-1), start[:, None] + jnp.arange(width, dtype=jnp.int32)[None, :], mode="clip")


def real_tokens(batch: Mapping[str, np.ndarray]) -> int:
    """The batch's non-padding tokens, packed or padded."""
    return int(np.count_nonzero(batch["segment_ids"] if "segment_ids" in batch else batch["attention_mask"]))


def row_inputs(arrays: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The forward's mask of a padded batch's rows, or a packed one's segments and positions."""
    if "segment_ids" in arrays:
        return {"segment_ids": arrays["segment_ids"], "positions": arrays["positions"]}
    return {"attention_mask": arrays["attention_mask"]}
