"""From rollout groups (parquet tables) to the fixed-shape arrays of one training batch.

Rows keep the order of the groups and of ``sample_idx`` within a group. Each row is the prompt
followed by the completion, left-aligned and right-padded to ``max_seq_len``. The loss mask covers
the completion's policy tokens: all of them, or for a multi-turn episode those its ``policy_mask``
marks (observation and tool-output tokens are context, never trained on). Arrays about
*predicted* tokens have length ``max_seq_len - 1`` (position t predicts token t + 1). The batch is
padded with empty rows (mask 0) to a multiple of ``row_multiple`` so that it splits evenly over the
devices and micro-batches.

A mixture of experts' rows also carry the experts the engine ran at each position
(``routed_experts`` [B, T, moe_layers, k], read as ``RoutedExperts`` says): they travel with the
tokens, and padding positions hold expert 0, which runs a finite expert on a position nothing reads.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from rlax_core.data.records import routed_experts_array

if TYPE_CHECKING:
    import pyarrow as pa


@dataclasses.dataclass(frozen=True)
class RoutedExperts:
    """How a mixture of experts' rollouts hold their routed experts (``records.routed_experts_bytes``):
    per token ``[moe_layers, experts_per_token]`` of ``dtype``. ``required`` (router replay): a rollout
    without them is refused; otherwise a batch with one such rollout carries no routed experts."""

    moe_layers: int
    experts_per_token: int
    dtype: str
    required: bool = False

    @classmethod
    def of(cls, model_config: Any, *, required: bool = False) -> RoutedExperts | None:
        """The layout of ``model_config``'s routed experts; None for a dense model (it records none)."""
        moe = model_config.moe
        if moe is None:
            return None
        return cls(len(model_config.moe_layers), moe.experts_per_token, moe.expert_id_dtype, required)

    @property
    def values_per_token(self) -> int:
        return self.moe_layers * self.experts_per_token


def batch_shapes(rollouts: int, *, max_seq_len: int, row_multiple: int = 1,
                 routed: RoutedExperts | None = None) -> dict[str, tuple[tuple[int, ...], type]]:
    """(shape, dtype) of each array of the batch ``make_batch`` builds from ``rollouts`` rows."""
    size, T = -(-rollouts // row_multiple) * row_multiple, max_seq_len
    shapes = {"tokens": ((size, T), np.int32), "attention_mask": ((size, T), np.int32),
              "loss_mask": ((size, T - 1), np.float32), "behavior_logprobs": ((size, T - 1), np.float32),
              "rewards": ((size,), np.float32), "group_ids": ((size,), np.int32), "sample_mask": ((size,), np.float32),
              "policy_versions": ((size,), np.int32)}
    if routed is not None:
        shapes["routed_experts"] = ((size, T, routed.moe_layers, routed.experts_per_token), np.dtype(routed.dtype))
    return shapes


def make_batch(groups: Sequence[pa.Table], *, max_seq_len: int, row_multiple: int = 1,
               pad_id: int = 0, routed: RoutedExperts | None = None) -> dict[str, np.ndarray]:
    """Arrays ``tokens, attention_mask [B, T]``, ``loss_mask, behavior_logprobs [B, T-1]`` and
    ``rewards, group_ids, sample_mask, policy_versions [B]``; ``token_rewards [B, T-1]`` when a
    rollout has them (on-policy distillation); with ``routed`` (a mixture of experts)
    ``routed_experts [B, T, moe_layers, k]`` when every rollout has them (see ``RoutedExperts``).

    Columnar: each list column is read as one flat array of values and placed with one indexed
    store, so a batch costs a few passes over its tokens rather than a Python loop over them (2,048
    rows of 2,560 tokens: 0.10 s against the loop's 0.54 s, on the trainer's critical path;
    ``benchmarks/batch_assembly.py``). A malformed rollout raises a ``ValueError`` naming it and
    its problem; of several, the first in batch order.
    """
    # pyarrow is imported by the functions that read tables: the trainer reads batch_shapes on hosts
    # that hold JAX alone (benchmarks/device_check.py's device machine).
    import pyarrow as pa
    import pyarrow.compute as pc

    tables = [table for table in groups if table.num_rows]
    if not tables:
        raise ValueError("a batch needs at least one rollout")
    # One table: rollouts written before the optional fields existed get nulls there, and narrower
    # types are widened (a group written with int64 token ids beside int32 ones).
    table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
    rows, T = table.num_rows, max_seq_len
    prompt_len, prompt_ids = _list_column(table, "prompt_ids")
    completion_len, completion_ids = _list_column(table, "completion_ids")
    logprob_len, logprobs = _list_column(table, "behavior_logprobs")
    policy_len, policy = _list_column(table, "policy_mask")
    token_reward_len, token_rewards = _list_column(table, "token_rewards")
    has_policy = policy_len >= 0
    _raise_for_the_first_malformed(table, T, prompt_len, completion_len, logprob_len, policy_len,
                                   _rows_with_invalid_ids(prompt_ids, prompt_len)
                                   | _rows_with_invalid_ids(completion_ids, completion_len), token_reward_len)

    routed_len, routed_values = _routed_experts(table, routed, prompt_len + completion_len)
    fill = {"tokens": pad_id, "group_ids": -1}
    batch = {name: np.full(shape, fill.get(name, 0), dtype) for name, (shape, dtype) in batch_shapes(
        rows, max_seq_len=T, row_multiple=row_multiple, routed=routed if routed_len is not None else None).items()}
    if routed_len is not None:  # each token's [moe_layers, k] values flat in its row
        _place(batch["routed_experts"].reshape(len(batch["tokens"]), -1), routed_values,
               routed_len * routed.values_per_token, start=np.zeros(rows, np.int64))
    _place(batch["tokens"], prompt_ids, prompt_len, start=0)
    _place(batch["tokens"], completion_ids, completion_len, start=prompt_len)
    batch["attention_mask"][:rows] = np.arange(T)[None, :] < (prompt_len + completion_len)[:, None]
    # Completion token k sits at position n_prompt + k and is predicted at position n_prompt + k - 1.
    trained = np.ones(len(completion_ids), np.float32)  # every token of a single-turn completion
    trained[np.repeat(has_policy, completion_len)] = policy  # an episode's policy tokens only
    _place(batch["loss_mask"], trained, completion_len, start=prompt_len - 1)
    _place(batch["behavior_logprobs"], logprobs, completion_len, start=prompt_len - 1)
    if (token_reward_len >= 0).any():  # per-token rewards (on-policy distillation); rows without them: 0
        batch["token_rewards"] = np.zeros_like(batch["behavior_logprobs"])
        _place(batch["token_rewards"], token_rewards, token_reward_len, start=prompt_len - 1)
    batch["rewards"][:rows] = pc.fill_null(table.column("reward").cast(pa.float32()), 0.0).to_numpy()
    group_index: dict[str, int] = {}
    batch["group_ids"][:rows] = [group_index.setdefault(g, len(group_index))
                                 for g in table.column("group_id").to_pylist()]
    batch["sample_mask"][:rows] = 1.0
    batch["policy_versions"][:rows] = table.column("policy_version").to_numpy()
    return batch


def _routed_experts(table: pa.Table, routed: RoutedExperts | None, tokens: np.ndarray):
    """Per row its routed experts' token count, and all rows' ids back to back; (None, None) when the
    batch carries none. A rollout without them (``routed.required``) or with a length other than its
    tokens' raises a ``ValueError`` naming it."""
    if routed is None:
        return None, None
    column = (table.column("routed_experts").combine_chunks() if "routed_experts" in table.column_names else None)
    missing = np.ones(table.num_rows, bool) if column is None else np.asarray(column.is_null())
    if missing.any():
        if routed.required:
            row = int(np.argmax(missing))
            raise ValueError(f"rollout {_name(table, row)} has no routed_experts: algorithm.router_replay replays the "
                             "experts the engine recorded (an episode's turns and a dense model's rollouts have none)")
        return None, None
    offsets = np.frombuffer(column.buffers()[1], np.int32)[column.offset:column.offset + len(column) + 1]
    data = np.frombuffer(column.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
    per_token = routed.values_per_token * np.dtype(routed.dtype).itemsize
    wrong = np.diff(offsets) != tokens * per_token
    if wrong.any():
        row = int(np.argmax(wrong))
        raise ValueError(f"rollout {_name(table, row)}: routed_experts of {offsets[row + 1] - offsets[row]} bytes for "
                         f"{tokens[row]} tokens x {routed.moe_layers} sparse layers x {routed.experts_per_token} "
                         f"experts of {routed.dtype}")
    return tokens, routed_experts_array(data, routed.moe_layers, routed.experts_per_token, routed.dtype).reshape(-1)


def _name(table: pa.Table, row: int) -> str:
    return f"{table.column('group_id')[row]}#{table.column('sample_idx')[row]}"


def _list_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Per row the list's length (-1: null, or no such column) and all rows' values back to back."""
    import pyarrow.compute as pc

    if name not in table.column_names:
        return np.full(table.num_rows, -1, np.int64), np.zeros(0)
    column = table.column(name).combine_chunks()
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), -1), np.int64)
    return lengths, column.flatten().to_numpy(zero_copy_only=False)


def _place(dest: np.ndarray, values: np.ndarray, lengths: np.ndarray, *, start) -> None:
    """Row r's ``lengths[r]`` values, taken in order from ``values``, into ``dest[r, start[r]:]``."""
    lengths = np.maximum(lengths, 0)
    # Flat index of value i of row r: r * width + start[r] + (i - the index of row r's first value).
    row_offset = np.arange(len(lengths)) * dest.shape[1] + start - (np.cumsum(lengths) - lengths)
    np.put(dest, np.repeat(row_offset, lengths) + np.arange(int(lengths.sum())), values)


def _rows_with_invalid_ids(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per row, whether one of its token ids is negative or beyond the batch's int32 tokens."""
    invalid = (ids < 0) | (ids > np.iinfo(np.int32).max)
    rows = np.zeros(len(lengths), bool)
    if invalid.any():
        rows[np.repeat(np.arange(len(lengths)), np.maximum(lengths, 0))[invalid]] = True
    return rows


def _raise_for_the_first_malformed(table, T, prompt_len, completion_len, logprob_len, policy_len, invalid_ids,
                                   token_reward_len):
    """A ``ValueError`` naming the first malformed rollout in batch order and its first problem."""
    problems = [(length < 0, lambda r, name=name: f" has no {name}")  # -1: a null list, or no such column
                for name, length in (("prompt_ids", prompt_len), ("completion_ids", completion_len),
                                     ("behavior_logprobs", logprob_len))]
    problems += [
        (prompt_len == 0, lambda r: " has an empty prompt"),
        (invalid_ids, lambda r: " has a token id outside [0, 2**31)"),
        (prompt_len + completion_len > T,
         lambda r: f" has {prompt_len[r]} + {completion_len[r]} tokens, more than trainer.max_seq_len={T}; raise it"),
        (logprob_len != completion_len,
         lambda r: f": {logprob_len[r]} behavior log-probs for {completion_len[r]} completion tokens"),
        ((policy_len >= 0) & (policy_len != completion_len),  # a single-turn rollout has none
         lambda r: f": a policy_mask of {policy_len[r]} for {completion_len[r]} completion tokens"),
        ((token_reward_len >= 0) & (token_reward_len != completion_len),
         lambda r: f": {token_reward_len[r]} token rewards for {completion_len[r]} completion tokens"),
    ]
    bad = np.logical_or.reduce([failed for failed, _ in problems])
    if bad.any():
        row = int(np.argmax(bad))
        describe = next(describe for failed, describe in problems if failed[row])
        raise ValueError(f"rollout {_name(table, row)}{describe(row)}")
