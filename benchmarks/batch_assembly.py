"""The trainer's host-side batch assembly: rollout groups (Arrow tables) -> the step's arrays.

``rlax_core.training.batching.make_batch`` sits on the trainer's critical path, between reading a
step's groups and the update. It reads each list column as one flat array and places it with one
indexed store. The baseline, in the same run, is the same layout built one rollout at a time
(``row_by_row``: a Python loop over ``to_pylist()`` rows, as ``make_batch`` did before). For each
size: the best of ``--repeats``, the two taken in turn (seconds and tokens per second), the ratio
baseline / ours, and a check that both built the same arrays. ``tests/training/test_batching.py`` holds ``make_batch`` to
``row_by_row`` on ragged, chunked and multi-turn inputs.

    python benchmarks/batch_assembly.py [--sizes 64x77,2048x2560] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlax_core.data.records import ROLLOUT_SCHEMA, to_table  # noqa: E402
from rlax_core.training.batching import batch_shapes, make_batch  # noqa: E402

from forward import best_times_interleaved  # noqa: E402  (the benchmarks' clock: best of interleaved repeats)

SAMPLES_PER_GROUP = 16


def row_by_row(groups, *, max_seq_len: int, row_multiple: int = 1, pad_id: int = 0) -> dict[str, np.ndarray]:
    """The batch layout (``batching``'s module docstring) stated one rollout at a time."""
    rows = [row for table in groups for row in table.to_pylist()]
    batch = {name: np.full(shape, {"tokens": pad_id, "group_ids": -1}.get(name, 0), dtype)
             for name, (shape, dtype) in batch_shapes(len(rows), max_seq_len=max_seq_len,
                                                      row_multiple=row_multiple).items()}
    group_index = {gid: i for i, gid in enumerate(dict.fromkeys(row["group_id"] for row in rows))}
    for i, row in enumerate(rows):
        prompt, completion = row["prompt_ids"], row["completion_ids"]
        start = len(prompt) - 1  # completion token k is predicted at position len(prompt) - 1 + k
        batch["tokens"][i, :len(prompt) + len(completion)] = prompt + completion
        batch["attention_mask"][i, :len(prompt) + len(completion)] = 1
        policy = row.get("policy_mask")
        batch["loss_mask"][i, start:start + len(completion)] = 1.0 if policy is None else policy
        batch["behavior_logprobs"][i, start:start + len(completion)] = row["behavior_logprobs"]
        batch["rewards"][i] = row["reward"] or 0.0
        batch["group_ids"][i] = group_index[row["group_id"]]
        batch["sample_mask"][i] = 1.0
        batch["policy_versions"][i] = row["policy_version"]
    return batch


def rollout_groups(rows: int, max_seq_len: int, seed: int = 0) -> list:
    """Groups of ``SAMPLES_PER_GROUP`` rollouts: a fifth of the row a prompt, completions of half to all the rest."""
    rng = np.random.default_rng(seed)
    max_prompt = max(1, max_seq_len // 5)
    tables = []
    for group in range(-(-rows // SAMPLES_PER_GROUP)):
        prompt = rng.integers(0, 32000, rng.integers(1, max_prompt + 1)).tolist()
        samples = []
        for sample in range(min(SAMPLES_PER_GROUP, rows - group * SAMPLES_PER_GROUP)):
            room = max_seq_len - len(prompt)
            completion = rng.integers(0, 32000, rng.integers(room // 2, room + 1)).tolist()
            samples.append(dict(example_id=str(group), group_id=f"g{group}", sample_idx=sample, policy_version=0,
                                seed=0, prompt_ids=prompt, completion_ids=completion,
                                behavior_logprobs=(-rng.random(len(completion))).tolist(), finish_reason="length",
                                reward=float(rng.random()), reward_info="{}"))
        tables.append(to_table(samples, ROLLOUT_SCHEMA))
    return tables


def measure(rows: int, max_seq_len: int, repeats: int) -> dict:
    groups = rollout_groups(rows, max_seq_len)
    ours, baseline = (fn(groups, max_seq_len=max_seq_len, row_multiple=8) for fn in (make_batch, row_by_row))
    same = all(ours[name].dtype == baseline[name].dtype and np.array_equal(ours[name], baseline[name])
               for name in baseline)
    tokens = int(ours["attention_mask"].sum())
    seconds, baseline_seconds = best_times_interleaved(
        [lambda: make_batch(groups, max_seq_len=max_seq_len, row_multiple=8),
         lambda: row_by_row(groups, max_seq_len=max_seq_len, row_multiple=8)], repeats)
    return {"rows": rows, "max_seq_len": max_seq_len, "tokens": tokens, "same_arrays": same,
            "seconds": seconds, "tokens_per_s": tokens / seconds,
            "baseline_seconds": baseline_seconds, "baseline_tokens_per_s": tokens / baseline_seconds,
            "speedup_vs_row_by_row": baseline_seconds / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64x77,2048x2560", help="ROWSxMAX_SEQ_LEN, comma-separated "
                        "(64x77: the GRPO step benchmark's batch; 2048x2560: a large job's step)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    try:
        sizes = [tuple(int(n) for n in size.split("x")) for size in args.sizes.split(",")]
        if any(len(size) != 2 or min(size) < 2 for size in sizes):
            raise ValueError
    except ValueError:
        parser.error(f"--sizes: ROWSxMAX_SEQ_LEN pairs of integers >= 2, not {args.sizes!r}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    result = {"load_average": os.getloadavg(),
              "sizes": [measure(rows, max_seq_len, args.repeats) for rows, max_seq_len in sizes]}
    print(json.dumps(result, indent=2))
    if not all(size["same_arrays"] for size in result["sizes"]):
        sys.exit("make_batch and the row-by-row baseline built different arrays")


if __name__ == "__main__":
    main()
