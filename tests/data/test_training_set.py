"""Training sets read from storage once per process: the rollout job's graph carries only the path."""

import pickle

import pytest

from rlax_core.data.training_set import cached_examples, read_examples
from rlax_core.tasks.story import story_examples, write_jsonl
from tests.support.rollout_spec import rollout_spec


def _spec(path, size):
    return rollout_spec(train_set=str(path), train_set_size=size)


def test_rows_come_back_sorted_by_id_whatever_the_file_order(tmp_path):
    rows = story_examples("train", 12)
    write_jsonl(reversed(rows), tmp_path / "train.jsonl")
    assert [r["id"] for r in read_examples(str(tmp_path / "train.jsonl"))] == sorted(r["id"] for r in rows)


def test_a_process_reads_a_training_set_once(tmp_path):
    path = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 5), path)
    first = cached_examples(str(path))
    path.unlink()  # a second read would fail: the rows must come from the process's cache
    assert cached_examples(str(path)) is first and len(first) == 5


def test_the_spec_pickles_to_the_same_size_whatever_the_training_set_holds(tmp_path):
    small, large = tmp_path / "small.jsonl", tmp_path / "large.jsonl"
    write_jsonl(story_examples("train", 10), small)
    write_jsonl(story_examples("train", 2000), large)
    sizes = {len(pickle.dumps(_spec(p, n))) for p, n in ((small, 10), (large, 2000))}
    assert max(sizes) - min(sizes) <= 4  # the path's length and the count's digits, nothing of the rows


def test_a_worker_that_reads_another_row_count_than_the_launcher_stops(tmp_path):
    path = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 3), path)
    assert len(_spec(path, 3).examples()) == 3
    with pytest.raises(RuntimeError, match="holds 3 rows, the job was launched with 4"):
        _spec(path, 4).examples()


def test_a_glob_of_parquet_shards_reads_every_shard(tmp_path):
    import pyarrow.parquet as pq

    from rlax_core.data.records import EXAMPLE_SCHEMA, to_table

    rows = story_examples("train", 6)
    for i in range(2):
        pq.write_table(to_table(rows[i * 3:(i + 1) * 3], EXAMPLE_SCHEMA), tmp_path / f"examples-{i}.parquet")
    (tmp_path / "stats.json").write_text("{}")
    assert len(read_examples(str(tmp_path / "examples-*.parquet"))) == 6
