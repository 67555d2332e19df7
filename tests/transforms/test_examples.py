"""ReadRawRecords + ToExamples: every bad row dead-lettered with its reason, every good row kept."""

import json

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.data.curation import InputSpec
from transforms.examples import ToExamples
from transforms.io import ReadRawRecords

GOOD = {"question": "Tom has 3 apples and eats one. How many are left?", "answer": "3 - 1 = 2\n#### 2"}


def test_bad_jsonl_rows_are_dead_lettered_with_their_reason(tmp_path, pipeline):
    path = tmp_path / "raw.jsonl"
    lines = [
        json.dumps(GOOD).encode(),
        b'{"question": "unterminated',  # malformed JSON
        json.dumps({"question": "No answer here?"}).encode(),  # missing field
        b'{"question": "caf\xe9?", "answer": "#### 1"}',  # Latin-1 byte: not UTF-8
        json.dumps({"question": "Q?", "answer": "no marker"}).encode(),  # unparseable answer
        json.dumps({"question": "Big?" + "x" * 600, "answer": "#### 1"}).encode(),  # huge row
        b"",  # blank lines are not records
        b"[1, 2]",  # not an object
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pipeline as p:
        examples, dead = (p | ReadRawRecords(str(path))
                          | ToExamples(InputSpec(path=str(path), format="gsm8k"), max_record_bytes=500))
        assert_that(examples | "Answers" >> beam.Map(lambda e: (e["source"], e["answer"], e["task"])),
                    equal_to([("gsm8k", "2", "math")]), label="kept")
        assert_that(dead | "Reasons" >> beam.Map(lambda d: d["reason"]),
                    equal_to(["malformed_json", "missing_field", "non_utf8", "unparseable_answer", "too_large",
                              "not_an_object"]), label="reasons")
        assert_that(dead | "RawKept" >> beam.Map(lambda d: (d["origin"] == str(path), "raw" in d and bool(d["raw"]))),
                    equal_to([(True, True)] * 6), label="raw")


def test_parquet_and_json_array_inputs(tmp_path, pipeline):
    table = pa.Table.from_pylist([GOOD, {"question": "Is 7 prime?", "answer": "yes"}])
    pq.write_table(table, tmp_path / "raw.parquet")
    (tmp_path / "mbpp.json").write_text(json.dumps([
        {"task_id": 2, "prompt": "Write a function add(a, b).", "code": "def add(a, b): return a + b",
         "test_list": ["assert add(1, 2) == 3"]},
        {"task_id": 3, "prompt": "Broken row without tests.", "code": "pass"},
    ]))
    with pipeline as p:
        math_rows, math_dead = (p | "ReadParquet" >> ReadRawRecords(str(tmp_path / "raw.parquet"))
                                | "Math" >> ToExamples(InputSpec(path="x", format="auto"), 1 << 20))
        code_rows, code_dead = (p | "ReadJson" >> ReadRawRecords(str(tmp_path / "mbpp.json"))
                                | "Code" >> ToExamples(InputSpec(path="y", format="mbpp", split="test"), 1 << 20))
        assert_that(math_rows | "MathAnswers" >> beam.Map(lambda e: e["answer"]), equal_to(["2"]), label="math")
        assert_that(math_dead | "MathWhy" >> beam.Map(lambda d: d["reason"]), equal_to(["unparseable_answer"]),
                    label="math_dead")
        assert_that(code_rows | "CodeRows" >> beam.Map(lambda e: (e["task"], e["split"], json.loads(e["tests"])["test_list"])),
                    equal_to([("code", "test", ["assert add(1, 2) == 3"])]), label="code")
        assert_that(code_dead | "CodeWhy" >> beam.Map(lambda d: d["reason"]), equal_to(["missing_field"]),
                    label="code_dead")


def test_datasets_folder_input(tmp_path, pipeline):
    import datasets

    datasets.Dataset.from_list([{"problem": "What is $1+1$?", "answer": "2", "id": 1}]).save_to_disk(str(tmp_path / "hf"))
    with pipeline as p:
        rows, _ = p | ReadRawRecords(str(tmp_path / "hf")) | ToExamples(InputSpec(path="z", format="aime"), 1 << 20)
        assert_that(rows | beam.Map(lambda e: (e["source"], e["answer"])), equal_to([("aime", "2")]))


def test_dead_letters_name_their_file_and_line_or_row(tmp_path, pipeline):
    jsonl = tmp_path / "part-1.jsonl"
    jsonl.write_bytes(b"\n".join([json.dumps(GOOD).encode(), b"", b"  ", b'{"question": "broken',
                                  json.dumps(GOOD).encode(), b"[3]"]) + b"\n")
    pq.write_table(pa.Table.from_pylist([GOOD, {"question": "Q?", "answer": "no marker"}, GOOD]), tmp_path / "part-2.parquet")
    (tmp_path / "part-3.json").write_text(json.dumps([GOOD, "not an object", GOOD]))
    spec = InputSpec(path="x", format="gsm8k")
    with pipeline as p:
        places = []
        for name in ("part-1.jsonl", "part-2.parquet", "part-3.json"):
            _, dead = (p | f"Read[{name}]" >> ReadRawRecords(str(tmp_path / name))
                       | f"Adapt[{name}]" >> ToExamples(spec, 1 << 20))
            places.append(dead)
        where = (places | beam.Flatten()
                 | beam.Map(lambda d: (d["reason"], d["origin"].rsplit("/", 1)[-1], d["line"], d["row"])))
        # Blank lines are counted, not read: the broken line is line 4 of the file.
        assert_that(where, equal_to([("malformed_json", "part-1.jsonl", 4, None),
                                     ("not_an_object", "part-1.jsonl", 6, None),
                                     ("unparseable_answer", "part-2.parquet", None, 1),
                                     ("not_an_object", "part-3.json", None, 1)]))


def test_jsonl_files_of_a_glob_number_their_own_lines(tmp_path, pipeline):
    for shard in range(2):
        (tmp_path / f"shard-{shard}.jsonl").write_text("\n".join(json.dumps({**GOOD, "i": i}) for i in range(3)) + "\n")
    with pipeline as p:
        lines = p | ReadRawRecords(str(tmp_path / "shard-*.jsonl")) | beam.Map(
            lambda raw: (raw["origin"].rsplit("/", 1)[-1], raw["line"], json.loads(raw["data"])["i"]))
        assert_that(lines, equal_to([(f"shard-{s}.jsonl", i + 1, i) for s in range(2) for i in range(3)]))
