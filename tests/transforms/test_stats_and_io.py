"""CurationStats adds up; the writers produce the files the pipelines promise."""

import json

import apache_beam as beam
import pyarrow.parquet as pq
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.data.curation import dead_letter
from rlax_core.data.records import make_example
from transforms.io import WriteExamples, WriteJsonFile, WriteJsonLines
from transforms.stats import CurationStats


def test_stats_count_every_outcome_and_add_up(pipeline):
    kept = [make_example(source="a", task="math", prompt=f"q{i}", answer="1") for i in range(3)]
    dead = [dead_letter("duplicate", "", {}, source="a", origin=None),
            dead_letter("malformed_json", "", b"{", source="b", origin="f"),
            {**dead_letter("contaminated", "", {}, source="b", origin=None), "matched": ["aime24"]}]
    with pipeline as p:
        raw = p | "Raw" >> beam.Create(range(6))
        stats = p | "Kept" >> beam.Create(kept) | CurationStats(raw, p | "Dead" >> beam.Create(dead))
        assert_that(stats | beam.Map(lambda s: (s["input"], s["kept"], s["duplicate"], s["near_duplicate"],
                                                s["contaminated"], s["dead_lettered"], s["consistent"],
                                                s["by_source"]["b"]["dead_lettered"], s["contaminated_by"])),
                    equal_to([(6, 3, 1, 0, 1, 1, True, 1, {"aime24": 1})]))


def test_stats_flag_counts_that_do_not_add_up(pipeline):
    with pipeline as p:
        raw = p | "Raw" >> beam.Create(range(2))
        stats = p | "Kept" >> beam.Create([make_example(source="a", task="math", prompt="q")]) | CurationStats(
            raw, p | "Dead" >> beam.Create([]))
        assert_that(stats | beam.Map(lambda s: (s["input"], s["kept"], s["consistent"])), equal_to([(2, 1, False)]))


def test_writers(tmp_path, pipeline):
    rows = [make_example(source="a", task="math", prompt=f"q{i}", answer=str(i)) for i in range(4)]
    with pipeline as p:
        p | "Rows" >> beam.Create(rows) | WriteExamples(str(tmp_path / "examples"), num_shards=2)
        p | "Dead" >> beam.Create([{"reason": "x", "raw": "é"}]) | WriteJsonLines(str(tmp_path / "dead_letter"))
        p | "One" >> beam.Create([{"input": 4}]) | WriteJsonFile(str(tmp_path / "stats.json"))
    shards = sorted(tmp_path.glob("examples-*.parquet"))
    assert [s.name for s in shards] == ["examples-00000-of-00002.parquet", "examples-00001-of-00002.parquet"]
    table = pq.ParquetDataset(shards).read()
    assert sorted(table.column("answer").to_pylist()) == ["0", "1", "2", "3"]
    assert {"id", "source", "prompt", "answer"} <= set(table.column_names)
    (dead_file,) = tmp_path.glob("dead_letter-*.jsonl")
    assert json.loads(dead_file.read_text(encoding="utf-8")) == {"reason": "x", "raw": "é"}
    assert json.loads((tmp_path / "stats.json").read_text()) == {"input": 4}


def test_write_named_files_and_take_smallest_ids(tmp_path, pipeline):
    from transforms.io import TakeSmallestIds, WriteNamedFiles

    rows = [{"id": f"r{i}"} for i in (5, 3, 9, 1)]
    with pipeline as p:
        paths = p | "Files" >> beam.Create([("a.png", b"\x89PNG"), ("b.md", b"# t")]) | WriteNamedFiles(str(tmp_path))
        assert_that(paths, equal_to([str(tmp_path / "a.png"), str(tmp_path / "b.md")]), label="paths")
        assert_that(p | "Rows" >> beam.Create(rows) | "Two" >> TakeSmallestIds(2) | "Ids" >> beam.Map(lambda r: r["id"]),
                    equal_to(["r1", "r3"]), label="smallest")
        assert_that(p | "Rows2" >> beam.Create(rows) | "All" >> TakeSmallestIds(0) | "Ids2" >> beam.Map(lambda r: r["id"]),
                    equal_to(["r5", "r3", "r9", "r1"]), label="all")
    assert (tmp_path / "a.png").read_bytes() == b"\x89PNG" and (tmp_path / "b.md").read_text() == "# t"
