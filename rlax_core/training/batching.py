"""From rollout groups (parquet tables) to the fixed-shape arrays of one training batch.

Rows keep the order of the groups and of ``sample_idx`` within a group. Each row is the prompt
followed by the completion, left-aligned and right-padded to ``max_seq_len``. The loss mask covers
the completion's policy tokens: all of them, or for a multi-turn episode those its ``policy_mask``
marks (observation and tool-output tokens are context, never trained on). Arrays about
*predicted* tokens have length ``max_seq_len - 1`` (position t predicts token t + 1). The batch is
padded with empty rows (mask 0) to a multiple of ``row_multiple`` so that it splits evenly over the
devices and micro-batches.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa


def batch_shapes(rollouts: int, *, max_seq_len: int, row_multiple: int = 1) -> dict[str, tuple[tuple[int, ...], type]]:
    """(shape, dtype) of each array of the batch ``make_batch`` builds from ``rollouts`` rows."""
    size, T = -(-rollouts // row_multiple) * row_multiple, max_seq_len
    return {"tokens": ((size, T), np.int32), "attention_mask": ((size, T), np.int32),
            "loss_mask": ((size, T - 1), np.float32), "behavior_logprobs": ((size, T - 1), np.float32),
            "rewards": ((size,), np.float32), "group_ids": ((size,), np.int32), "sample_mask": ((size,), np.float32),
            "policy_versions": ((size,), np.int32)}


def make_batch(groups: Sequence[pa.Table], *, max_seq_len: int, row_multiple: int = 1,
               pad_id: int = 0) -> dict[str, np.ndarray]:
    """Arrays ``tokens, attention_mask [B, T]``, ``loss_mask, behavior_logprobs [B, T-1]`` and
    ``rewards, group_ids, sample_mask, policy_versions [B]``."""
    rows = [row for table in groups for row in table.to_pylist()]
    if not rows:
        raise ValueError("a batch needs at least one rollout")
    group_index = {gid: i for i, gid in enumerate(dict.fromkeys(row["group_id"] for row in rows))}
    T = max_seq_len
    fill = {"tokens": pad_id, "group_ids": -1}
    batch = {name: np.full(shape, fill.get(name, 0), dtype)
             for name, (shape, dtype) in batch_shapes(len(rows), max_seq_len=T, row_multiple=row_multiple).items()}
    for i, row in enumerate(rows):
        prompt, completion = row["prompt_ids"], row["completion_ids"]
        n_prompt, n_completion = len(prompt), len(completion)
        if n_prompt == 0:
            raise ValueError(f"rollout {row['group_id']}#{row['sample_idx']} has an empty prompt")
        if n_prompt + n_completion > T:
            raise ValueError(f"rollout {row['group_id']}#{row['sample_idx']} has {n_prompt} + {n_completion} "
                             f"tokens, more than trainer.max_seq_len={T}; raise it")
        if len(row["behavior_logprobs"]) != n_completion:
            raise ValueError(f"rollout {row['group_id']}#{row['sample_idx']}: {len(row['behavior_logprobs'])} "
                             f"behavior log-probs for {n_completion} completion tokens")
        policy = row.get("policy_mask")
        if policy is not None and len(policy) != n_completion:
            raise ValueError(f"rollout {row['group_id']}#{row['sample_idx']}: a policy_mask of {len(policy)} "
                             f"for {n_completion} completion tokens")
        batch["tokens"][i, :n_prompt] = prompt
        batch["tokens"][i, n_prompt:n_prompt + n_completion] = completion
        batch["attention_mask"][i, :n_prompt + n_completion] = 1
        # Completion token k sits at position n_prompt + k and is predicted at position n_prompt + k - 1.
        batch["loss_mask"][i, n_prompt - 1:n_prompt - 1 + n_completion] = 1.0 if policy is None else policy
        batch["behavior_logprobs"][i, n_prompt - 1:n_prompt - 1 + n_completion] = row["behavior_logprobs"]
        batch["rewards"][i] = 0.0 if row["reward"] is None else row["reward"]
        batch["group_ids"][i] = group_index[row["group_id"]]
        batch["sample_mask"][i] = 1.0
        batch["policy_versions"][i] = row["policy_version"]
    return batch
