"""Inputs as people write them: a UTF-8 byte-order mark (as editors and spreadsheet exports write one)
costs no row, in every text reader rlax has. YAML configs: tests/foundation/test_config.py."""

import argparse
import gzip
import json

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.data.curation import InputSpec, parse_json_line
from rlax_core.data.records import EXAMPLE_SCHEMA, make_example, to_table
from transforms.examples import ToExamples
from transforms.io import ReadRawRecords, hf_dataset

BOM = "\ufeff".encode()
ROWS = [{"question": "Tom has 3 apples and eats one. How many are left?", "answer": "3 - 1 = 2\n#### 2"},
        {"question": "What is 5 times 4?", "answer": "5 * 4 = 20\n#### 20"}]


def curated(pipeline, path, **spec):
    """(answers kept, dead-letter reasons) of curating ``path`` as GSM8K rows."""
    with pipeline as p:
        examples, dead = (p | ReadRawRecords(str(path))
                          | ToExamples(InputSpec(path=str(path), format="gsm8k", **spec), max_record_bytes=1 << 16))
        assert_that(examples | "Answers" >> beam.Map(lambda e: e["answer"]), equal_to(["2", "20"]), label="kept")
        assert_that(dead, equal_to([]), label="dead")


@pytest.mark.parametrize("compressed", [False, True], ids=["jsonl", "jsonl.gz"])
def test_jsonl(tmp_path, pipeline, compressed):
    data = BOM + b"".join(json.dumps(row).encode() + b"\r\n" for row in ROWS)  # CRLF too: a Windows editor
    path = tmp_path / ("raw.jsonl.gz" if compressed else "raw.jsonl")
    path.write_bytes(gzip.compress(data) if compressed else data)
    curated(pipeline, path)


def test_jsonl_line_parser():
    assert parse_json_line(BOM + b'{"a": 1}', 100) == {"a": 1}


def test_json_array(tmp_path, pipeline):
    (tmp_path / "raw.json").write_bytes(BOM + json.dumps(ROWS).encode())
    curated(pipeline, tmp_path / "raw.json")


def test_csv(tmp_path, pipeline):
    # A spreadsheet export: BOM, CRLF, a quoted field holding a line break.
    text = 'question,answer\r\n"Tom has 3 apples and eats one. How many are left?","3 - 1 = 2\r\n#### 2"\r\n' \
           'What is 5 times 4?,"5 * 4 = 20\r\n#### 20"\r\n'
    (tmp_path / "raw.csv").write_bytes(BOM + text.encode())
    curated(pipeline, tmp_path / "raw.csv")


def test_csv_rows_that_cannot_be_read_are_dead_lettered_by_line(tmp_path, pipeline):
    good = 'question,answer\n"What is 5 times 4?","#### 20"\n"2 + 2?","#### 4","four"\n'
    (tmp_path / "bad.csv").write_bytes(BOM + good.encode() + b'"Is caf\xe9 open?","#### 1"\n')
    with pipeline as p:
        examples, dead = (p | ReadRawRecords(str(tmp_path / "bad.csv"))
                          | ToExamples(InputSpec(path=str(tmp_path / "bad.csv"), format="gsm8k"), 1 << 16))
        assert_that(examples | beam.Map(lambda e: e["answer"]), equal_to(["20"]), label="kept")
        assert_that(dead | beam.Map(lambda d: (d["reason"], d["line"])), equal_to([("malformed_csv", 3), ("non_utf8", 4)]), label="dead")


def test_a_training_set_of_jsonl(tmp_path):
    from rlax_core.data.training_set import read_examples

    rows = [make_example(source="s", prompt=row["question"], task="math", answer="2") for row in ROWS]
    (tmp_path / "train.jsonl").write_bytes(BOM + b"\n".join(json.dumps(row).encode() for row in rows))
    assert len(read_examples(str(tmp_path / "train.jsonl"))) == 2
    assert to_table(rows, EXAMPLE_SCHEMA).num_rows == 2


def test_a_prompts_file_for_rlax_generate(tmp_path):
    from pipelines.generate import read_prompts

    (tmp_path / "prompts.jsonl").write_bytes(BOM + b'{"id": "a", "prompt": "Once upon a time"}\n')
    (tmp_path / "prompts.txt").write_bytes(BOM + b"Once upon a time\n")
    assert read_prompts(argparse.Namespace(prompts_file=str(tmp_path / "prompts.jsonl"), prompt=None)) == \
        [("a", "Once upon a time")]
    assert read_prompts(argparse.Namespace(prompts_file=str(tmp_path / "prompts.txt"), prompt=None)) == \
        [("1", "Once upon a time")]


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_hugging_face_folder_of_data_files(tmp_path, pipeline, monkeypatch, kind):
    # hf:DIR reads a folder of data files through datasets (pyarrow's JSON and CSV readers): checked
    # here that they take the mark as we do, and do not make it part of the first column's name.
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    folder = tmp_path / "data"
    folder.mkdir()
    if kind == "jsonl":
        (folder / "train.jsonl").write_bytes(BOM + b"\n".join(json.dumps(row).encode() for row in ROWS))
    else:
        text = "question,answer\n" + "".join(f'"{r["question"]}","{r["answer"]}"\n' for r in ROWS)
        (folder / "train.csv").write_bytes(BOM + text.encode())
    hf_dataset.cache_clear()
    try:
        curated(pipeline, f"hf:{folder}")
    finally:
        hf_dataset.cache_clear()
