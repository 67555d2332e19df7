"""Reading raw datasets and writing curated outputs (local paths or gs://, via Beam's file systems).

Raw rows leave :class:`ReadRawRecords` as ``{"origin": file, "line": n, "data": bytes}`` (JSON
Lines, still undecoded so that a bad line can be dead-lettered instead of failing the read; ``line``
counts from 1 as editors do), ``{"origin": file, "line": n, "record": dict}`` (CSV, by the line a
row starts on) or ``{"origin": file, "row": i, "record": dict}`` (JSON arrays, parquet and Hugging
Face datasets; ``row`` counts from 0 as dataframes do), so a dead letter names the file and the line
or row a user must look at; a file that cannot be read on gives ``"error": (reason, detail)``.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Iterator

import apache_beam as beam
from apache_beam.io import fileio

from rlax_core.data.curation import csv_records
from rlax_core.data.records import EXAMPLE_SCHEMA

HF_ROWS_PER_SHARD = 1000  # rows of a Hugging Face dataset per work unit


def file_kind(path: str) -> str:
    """How to read ``path``: jsonl, json (one array), parquet, csv (a header line) or hf
    (``hf:NAME[:CONFIG]:SPLIT`` or a ``save_to_disk`` folder)."""
    if path.startswith("hf:"):
        return "hf"
    lowered = path.lower().rstrip("/")
    for suffix, kind in ((".jsonl", "jsonl"), (".jsonl.gz", "jsonl"), (".ndjson", "jsonl"), (".json", "json"),
                         (".parquet", "parquet"), (".csv", "csv"), (".csv.gz", "csv")):
        if lowered.endswith(suffix):
            return kind
    return "hf"  # a folder written by datasets' save_to_disk


def parse_hf_path(path: str) -> tuple[str, str | None, str]:
    """``hf:NAME[:CONFIG]:SPLIT`` -> (name, config, split); ``hf:NAME`` is its train split.

    ``hf:openai/gsm8k:main:test``, ``hf:gsm8k:main:train``, ``hf:my_org/data:validation``; NAME may
    also be a local folder of data files (what ``datasets.load_dataset`` takes).
    """
    parts = path[3:].split(":")
    if not parts[0] or len(parts) > 3 or not all(parts):
        raise ValueError(f"{path}: write hf:NAME, hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT")
    if len(parts) == 1:
        return parts[0], None, "train"
    if len(parts) == 2:
        return parts[0], None, parts[1]
    return parts[0], parts[1], parts[2]


@functools.lru_cache(maxsize=8)
def hf_dataset(path: str):
    """The dataset ``path`` names, loaded once per worker process.

    Through ``datasets``' own cache (``HF_DATASETS_CACHE``, default ``~/.cache/huggingface/datasets``):
    a dataset prepared there before is memory-mapped, not downloaded again; set
    ``HF_DATASETS_OFFLINE=1`` where there is no network. A ``save_to_disk`` folder is read with
    ``load_from_disk``.
    """
    import datasets

    if path.startswith("hf:"):
        name, config, split = parse_hf_path(path)
        return datasets.load_dataset(name, config, split=split)
    dataset = datasets.load_from_disk(path)
    if isinstance(dataset, datasets.DatasetDict):
        if len(dataset) != 1:
            raise ValueError(f"{path} holds splits {list(dataset)}; name one folder per split")
        dataset = next(iter(dataset.values()))
    return dataset


def hf_shards(path: str, rows_per_shard: int = HF_ROWS_PER_SHARD) -> Iterator[tuple[str, int, int]]:
    """``(path, start, stop)`` row ranges covering the dataset: the work units workers read."""
    size = len(hf_dataset(path))
    for start in range(0, size, rows_per_shard):
        yield path, start, min(size, start + rows_per_shard)


def hf_rows(shard: tuple[str, int, int]) -> Iterator[dict[str, Any]]:
    path, start, stop = shard
    for offset, record in enumerate(hf_dataset(path).select(range(start, stop))):
        yield {"origin": path, "row": start + offset, "record": record}


def _jsonl_lines(readable: fileio.ReadableFile) -> Iterator[dict[str, Any]]:
    """The non-blank lines of one JSON Lines file (gzip too), numbered from 1."""
    path = readable.metadata.path
    with readable.open() as handle:  # readline: Beam's gzip reader is no line iterator
        for number, line in enumerate(iter(handle.readline, b""), 1):
            line = line.rstrip(b"\r\n")
            if line.strip():
                yield {"origin": path, "line": number, "data": line}


def _json_array_items(readable: fileio.ReadableFile) -> Iterator[dict[str, Any]]:
    """The items of a file holding one JSON array; a file that is not one becomes one bad raw row."""
    data = readable.read()
    try:
        items = json.loads(data.decode("utf-8-sig"))  # a byte-order mark is not data
    except (UnicodeDecodeError, json.JSONDecodeError):
        yield {"origin": readable.metadata.path, "line": None, "data": data}
        return
    if not isinstance(items, list):
        items = [items]
    for index, item in enumerate(items):
        yield {"origin": readable.metadata.path, "row": index, "record": item}


def _csv_rows(readable: fileio.ReadableFile) -> Iterator[dict[str, Any]]:
    """The rows of one CSV file, numbered by the line each starts on (``rlax_core.data.curation.csv_records``)."""
    with readable.open() as handle:
        for row in csv_records(iter(handle.readline, b"")):
            yield {"origin": readable.metadata.path, **row}


def _parquet_rows(readable: fileio.ReadableFile) -> Iterator[dict[str, Any]]:
    """The rows of one parquet file, a record batch at a time, numbered from 0."""
    import pyarrow.parquet as pq

    path, row = readable.metadata.path, 0
    with readable.open() as handle:
        for batch in pq.ParquetFile(handle).iter_batches(batch_size=1024):
            for record in batch.to_pylist():
                yield {"origin": path, "row": row, "record": record}
                row += 1


class ReadRawRecords(beam.PTransform):
    """Every raw row of ``path`` (file, glob, folder or ``hf:NAME[:CONFIG]:SPLIT``), with its file and
    line or row number, undecoded where the format allows.

    Files are read whole by one worker each (a line number needs the lines before it) and the rows
    reshuffled so that adapting them spreads over the workers; a Hugging Face dataset is cut into
    ``hf_rows_per_shard``-row ranges that workers read from their own ``datasets`` cache, so no
    element holds the whole dataset and the job graph holds only its name.
    """

    def __init__(self, path: str, hf_rows_per_shard: int = HF_ROWS_PER_SHARD):
        super().__init__()
        self.path, self.hf_rows_per_shard = path, hf_rows_per_shard
        if file_kind(path) == "hf" and path.startswith("hf:"):
            parse_hf_path(path)  # a malformed name fails here, before the pipeline runs

    def expand(self, pbegin):
        kind = file_kind(self.path)
        if kind == "hf":
            rows_per_shard = self.hf_rows_per_shard
            return (pbegin
                    | "Path" >> beam.Create([self.path])
                    | "PlanShards" >> beam.FlatMap(hf_shards, rows_per_shard)
                    | "SpreadShards" >> beam.Reshuffle()
                    | "ReadShard" >> beam.FlatMap(hf_rows))
        rows_of_file = {"jsonl": _jsonl_lines, "json": _json_array_items, "parquet": _parquet_rows, "csv": _csv_rows}[kind]
        return (pbegin
                | "Match" >> fileio.MatchFiles(self.path)
                | "Open" >> fileio.ReadMatches()
                | "Rows" >> beam.FlatMap(rows_of_file)
                | "Spread" >> beam.Reshuffle())


class WriteExamples(beam.PTransform):
    """Rows as ``PREFIX-SSSSS-of-NNNNN.parquet`` with the Example schema, or another of ``rlax_core.data.records``."""

    def __init__(self, prefix: str, num_shards: int = 0, schema=EXAMPLE_SCHEMA):
        super().__init__()
        self.prefix, self.num_shards, self.schema = prefix, num_shards, schema

    def expand(self, examples):
        return examples | "WriteParquet" >> beam.io.WriteToParquet(
            self.prefix, schema=self.schema, file_name_suffix=".parquet", num_shards=self.num_shards)


class WriteJsonLines(beam.PTransform):
    """Dicts as ``PREFIX-SSSSS-of-NNNNN.jsonl``, one JSON object a line."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def expand(self, rows):
        return (
            rows
            | "ToJson" >> beam.Map(lambda row: json.dumps(row, ensure_ascii=False, sort_keys=True, default=str))
            | "Write" >> beam.io.WriteToText(self.prefix, file_name_suffix=".jsonl")
        )


class WriteJsonFile(beam.PTransform):
    """A PCollection holding one dict, written as the single pretty-printed JSON file ``path``."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def expand(self, singleton):
        return (
            singleton
            | "ToJson" >> beam.Map(lambda value: json.dumps(value, indent=2, sort_keys=True, default=str))
            | "Write" >> beam.io.WriteToText(self.path, shard_name_template="", num_shards=1)
        )


class WriteNamedFiles(beam.PTransform):
    """``(file name, bytes)`` pairs written as ``folder/name`` (reports, images); returns the paths."""

    def __init__(self, folder: str):
        super().__init__()
        self.folder = folder.rstrip("/")

    def expand(self, named_files):
        folder = self.folder

        def write(item) -> str:
            from apache_beam.io.filesystems import FileSystems

            name, data = item
            path = f"{folder}/{name}"
            with FileSystems.create(path) as handle:
                handle.write(data)
            return path

        return named_files | "Write" >> beam.Map(write)


class TakeSmallestIds(beam.PTransform):
    """The ``count`` rows with the smallest ids: a fixed, order-independent slice (0 keeps all)."""

    def __init__(self, count: int):
        super().__init__()
        self.count = count

    def expand(self, rows):
        if self.count <= 0:
            return rows
        return (rows
                | "Smallest" >> beam.combiners.Top.Smallest(self.count, key=lambda row: row["id"])
                | "Flatten" >> beam.FlatMap(lambda chosen: chosen))


def read_json(path: str) -> Any:
    """A JSON file through Beam's file systems (local or gs://)."""
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as handle:
        return json.loads(handle.read().decode("utf-8"))
