"""make_batch: the columnar assembly against the layout stated one rollout at a time, and bad rollouts.

The statement is ``benchmarks/batch_assembly.py``'s baseline (``row_by_row``), which the benchmark
times against ``make_batch``; the benchmark itself runs here too, sized down.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from rlax_core.data.records import ROLLOUT_SCHEMA, to_table
from rlax_core.training.batching import make_batch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

from batch_assembly import row_by_row  # noqa: E402

WIDE_IDS = pa.schema([pa.field(f.name, pa.list_(pa.int64())) if f.name in ("prompt_ids", "completion_ids") else f
                      for f in ROLLOUT_SCHEMA])


def rollout(group, sample, prompt, completion, *, reward=1.0, policy_mask=None, version=0, rng=None):
    rng = rng or np.random.default_rng(sample)
    row = dict(example_id=str(group), group_id=f"g{group}", sample_idx=sample, policy_version=version, seed=0,
               prompt_ids=list(prompt), completion_ids=list(completion),
               behavior_logprobs=(-rng.random(len(completion))).astype(np.float32).tolist(),
               finish_reason="length", reward=reward, reward_info="{}")
    if policy_mask is not None:
        row["policy_mask"] = list(policy_mask)
    return row


def random_groups(rng, groups=6, samples=4, max_prompt=9, max_completion=12):
    tables = []
    for g in range(groups):
        prompt = rng.integers(1, 500, rng.integers(1, max_prompt + 1))
        rows = []
        for s in range(samples):
            completion = rng.integers(1, 500, rng.integers(0, max_completion + 1))  # empty completions too
            episode = g % 3 == 1
            rows.append(rollout(g, s, prompt, completion, reward=None if s == 2 else float(rng.random()),
                                policy_mask=rng.integers(0, 2, len(completion)) if episode else None,
                                version=int(rng.integers(0, 5)), rng=rng))
        tables.append(to_table(rows, ROLLOUT_SCHEMA))
    return tables


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("row_multiple,pad_id", [(1, 0), (8, 3)])
def test_the_columnar_batch_is_the_row_by_row_layout(seed, row_multiple, pad_id):
    rng = np.random.default_rng(seed)
    tables = random_groups(rng)
    # Tables as the store and Beam hand them over: several chunks, a slice, and a group written
    # before the optional episode fields existed.
    tables[0] = pa.concat_tables([tables[0].slice(0, 2), tables[0].slice(2)])
    tables[1] = pa.concat_tables([tables[1], tables[1]]).slice(tables[1].num_rows // 2, tables[1].num_rows)
    tables[2] = tables[2].drop_columns(["policy_mask", "turn_versions", "episode"])
    expected = row_by_row(tables, max_seq_len=21, row_multiple=row_multiple, pad_id=pad_id)
    batch = make_batch(tables, max_seq_len=21, row_multiple=row_multiple, pad_id=pad_id)
    assert batch.keys() == expected.keys()
    for name in expected:
        assert batch[name].dtype == expected[name].dtype, name
        np.testing.assert_array_equal(batch[name], expected[name], err_msg=name)


def test_token_ids_of_wider_types_are_read_alike():
    rows = [rollout(0, 0, [5, 6], [7, 8, 9]), rollout(0, 1, [5, 6], [10])]
    narrow = to_table(rows, ROLLOUT_SCHEMA)
    wide = pa.Table.from_pylist([rollout(1, 0, [1, 2, 3], [4], reward=None)], schema=WIDE_IDS)
    batch = make_batch([narrow, wide], max_seq_len=6)
    np.testing.assert_array_equal(batch["tokens"][2], [1, 2, 3, 4, 0, 0])
    assert batch["rewards"][2] == 0.0 and list(batch["group_ids"]) == [0, 0, 1]


@pytest.mark.parametrize("bad,message", [
    (dict(prompt=[]), "g1#1 has an empty prompt"),
    (dict(completion=list(range(1, 12))), "g1#1 has 3 + 11 tokens, more than trainer.max_seq_len=12"),
    (dict(logprobs=[-0.5]), "g1#1: 1 behavior log-probs for 2 completion tokens"),
    (dict(policy_mask=[1, 0, 1]), "g1#1: a policy_mask of 3 for 2 completion tokens"),
    (dict(completion=[4, -1]), "g1#1 has a token id outside [0, 2**31)"),
    (dict(prompt=[1, 2**31, 3]), "g1#1 has a token id outside [0, 2**31)"),
])
def test_a_malformed_rollout_is_named_and_the_first_one_reported(bad, message):
    def table(group, first_bad):
        rows = []
        for s in range(3):
            spec = dict(prompt=[1, 2, 3], completion=[4, 5])
            if s >= first_bad:
                spec.update(bad)
            row = rollout(group, s, spec["prompt"], spec["completion"], policy_mask=spec.get("policy_mask"))
            if "logprobs" in spec:
                row["behavior_logprobs"] = spec["logprobs"]
            rows.append(row)
        return pa.Table.from_pylist(rows, schema=WIDE_IDS)  # int64 ids: room for one beyond int32

    with pytest.raises(ValueError, match=re.escape(f"rollout {message}")):
        make_batch([table(0, 3), table(1, 1), table(2, 0)], max_seq_len=12)


def test_a_batch_without_rollouts_is_refused():
    with pytest.raises(ValueError, match="at least one rollout"):
        make_batch([], max_seq_len=8)
    with pytest.raises(ValueError, match="at least one rollout"):
        make_batch([to_table([], ROLLOUT_SCHEMA)], max_seq_len=8)


def test_a_rollout_without_its_tokens_is_named():
    rows = [rollout(0, 0, [1, 2], [3]), rollout(0, 1, [1, 2], [3])]
    table = to_table(rows, ROLLOUT_SCHEMA)
    index = table.schema.get_field_index("completion_ids")
    nullable = table.schema.set(index, pa.field("completion_ids", pa.list_(pa.int32())))
    broken = table.cast(nullable).set_column(index, "completion_ids", pa.array([[3], None], pa.list_(pa.int32())))
    with pytest.raises(ValueError, match="rollout g0#1 has no completion_ids"):
        make_batch([broken], max_seq_len=8)
    with pytest.raises(ValueError, match="rollout g0#0 has no behavior_logprobs"):
        make_batch([table.drop_columns(["behavior_logprobs"])], max_seq_len=8)


def test_the_benchmark_builds_the_same_arrays_both_ways():
    out = subprocess.run([sys.executable, "benchmarks/batch_assembly.py", "--sizes", "64x77,96x300", "--repeats", "1"],
                         cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    sizes = json.loads(out.stdout)["sizes"]
    assert [(s["rows"], s["max_seq_len"]) for s in sizes] == [(64, 77), (96, 300)]
    assert all(s["same_arrays"] and s["speedup_vs_row_by_row"] > 0 for s in sizes)
