"""Reading raw datasets and writing curated outputs (local paths or gs://, via Beam's file systems).

Raw rows leave :class:`ReadRawRecords` as ``{"origin": where, "data": bytes}`` (text formats, still
undecoded so that a bad line can be dead-lettered instead of failing the read) or
``{"origin": where, "record": dict}`` (columnar formats).
"""

from __future__ import annotations

import json
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.io import fileio

from rlax_core.data.records import EXAMPLE_SCHEMA


def file_kind(path: str) -> str:
    """How to read ``path``: jsonl, json (one array), parquet or hf (a datasets folder or ``hf:NAME``)."""
    if path.startswith("hf:"):
        return "hf"
    lowered = path.lower().rstrip("/")
    for suffix, kind in ((".jsonl", "jsonl"), (".jsonl.gz", "jsonl"), (".ndjson", "jsonl"), (".json", "json"),
                         (".parquet", "parquet")):
        if lowered.endswith(suffix):
            return kind
    return "hf"  # a folder written by datasets' save_to_disk


def _load_hf(path: str):
    """Rows of a Hugging Face dataset: ``hf:NAME[:SPLIT]`` from the hub, or a save_to_disk folder."""
    import datasets

    if path.startswith("hf:"):
        name, _, split = path[3:].partition(":")
        dataset = datasets.load_dataset(name, split=split or "train")
    else:
        dataset = datasets.load_from_disk(path)
        if isinstance(dataset, datasets.DatasetDict):
            if len(dataset) != 1:
                raise ValueError(f"{path} holds splits {list(dataset)}; name one folder per split")
            dataset = next(iter(dataset.values()))
    for index, row in enumerate(dataset):
        yield {"origin": f"{path}#{index}", "record": row}


def _json_array_items(readable: fileio.ReadableFile):
    """The items of a file holding one JSON array; a file that is not one becomes one bad raw row."""
    data = readable.read()
    try:
        items = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        yield {"origin": readable.metadata.path, "data": data}
        return
    if not isinstance(items, list):
        items = [items]
    for index, item in enumerate(items):
        yield {"origin": f"{readable.metadata.path}#{index}", "record": item}


class ReadRawRecords(beam.PTransform):
    """Every raw row of ``path`` (file, glob, folder or hf:NAME), undecoded where the format allows."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def expand(self, pbegin):
        kind = file_kind(self.path)
        if kind == "jsonl":
            return (
                pbegin
                | "ReadLines" >> beam.io.ReadFromTextWithFilename(self.path, coder=BytesCoder())
                | "SkipBlank" >> beam.Filter(lambda item: item[1].strip() != b"")
                | "AsRaw" >> beam.Map(lambda item: {"origin": item[0], "data": item[1]})
            )
        if kind == "json":
            return (
                pbegin
                | "Match" >> fileio.MatchFiles(self.path)
                | "Open" >> fileio.ReadMatches()
                | "Items" >> beam.FlatMap(_json_array_items)
            )
        if kind == "parquet":
            path = self.path
            return (
                pbegin
                | "ReadParquet" >> beam.io.ReadFromParquet(path)
                | "AsRaw" >> beam.Map(lambda row: {"origin": path, "record": row})
            )
        return pbegin | "Path" >> beam.Create([self.path]) | "LoadDataset" >> beam.FlatMap(_load_hf)


class WriteExamples(beam.PTransform):
    """Example rows as ``PREFIX-SSSSS-of-NNNNN.parquet`` with the shared Example schema."""

    def __init__(self, prefix: str, num_shards: int = 0):
        super().__init__()
        self.prefix, self.num_shards = prefix, num_shards

    def expand(self, examples):
        return examples | "WriteParquet" >> beam.io.WriteToParquet(
            self.prefix, schema=EXAMPLE_SCHEMA, file_name_suffix=".parquet", num_shards=self.num_shards)


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
