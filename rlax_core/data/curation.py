"""Curation settings and the per-record steps the curate pipeline shares with plain Python.

The Beam pipeline (``pipelines/curate.py``) and any single-process reimplementation call the same
functions here, so both apply the same rules: decode and parse one raw line, adapt it, and describe
a rejected row as a dead-letter record.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import PurePosixPath
from typing import Any, Iterable, Iterator

from rlax_core.config import require
from rlax_core.data.formats import FORMATS, FormatError, FieldMapping

# Dead-letter reasons grouped into the categories that ``stats.json`` counts; every other reason
# (malformed input) counts as ``dead_lettered``.
DUPLICATE, NEAR_DUPLICATE, CONTAMINATED = "duplicate", "near_duplicate", "contaminated"
STAT_NAMES = ("kept", DUPLICATE, NEAR_DUPLICATE, CONTAMINATED, "dead_lettered")

# How much of a rejected raw record the dead-letter file keeps (huge rows are cut, marked as cut).
RAW_KEEP_CHARS = 4096


@dataclasses.dataclass(frozen=True)
class InputSpec:
    """One raw dataset: a path or glob (local or gs://), its layout and how to label its rows."""

    path: str
    format: str = "auto"  # a layout from rlax_core.data.formats.FORMATS
    source: str | None = None  # defaults to the layout name (auto: the detected one)
    split: str | None = None
    mapping: FieldMapping = FieldMapping()  # the ``generic`` layout only
    databases: str | None = None  # spider / bird: the folder of SQLite databases (local or gs://)
    schema_rows: int = 0  # spider / bird: rows of each table shown under the prompt's schema

    def __post_init__(self):
        require(bool(self.path), "path", "a file, glob, directory or hf:NAME[:CONFIG]:SPLIT")
        require(self.format in FORMATS, "format", f"one of {', '.join(FORMATS)}")
        require(self.schema_rows >= 0, "schema_rows", "an integer >= 0")


@dataclasses.dataclass(frozen=True)
class CurateConfig:
    inputs: tuple[InputSpec, ...] = ()
    decontaminate_against: tuple[InputSpec, ...] = ()  # evaluation sets; source = the set's name
    output: str = ""  # folder, local or gs://
    near_duplicate_threshold: float = 0.8  # estimated Jaccard similarity of word shingles
    minhash_num_perm: int = 128
    shingle_size: int = 3  # words per MinHash shingle
    minhash_seed: int = 1
    contamination_ngram: int = 13  # words per n-gram shared with an evaluation set
    max_record_bytes: int = 1 << 20  # longer raw records are dead-lettered as too_large
    num_shards: int = 0  # parquet shards; 0 lets the runner decide

    def __post_init__(self):
        require(0.0 < self.near_duplicate_threshold <= 1.0, "near_duplicate_threshold", "a number in (0, 1]")
        require(self.minhash_num_perm >= 16, "minhash_num_perm", "an integer >= 16")
        require(self.shingle_size >= 1, "shingle_size", "an integer >= 1")
        require(self.contamination_ngram >= 1, "contamination_ngram", "an integer >= 1")
        require(self.max_record_bytes >= 64, "max_record_bytes", "an integer >= 64")
        require(self.num_shards >= 0, "num_shards", "an integer >= 0")


def eval_set_name(spec: InputSpec) -> str:
    """An evaluation set's name in reports: its ``source``, else its folder and file, e.g. ``aime24/test``
    (a Hugging Face dataset: its name and split, ``hf:openai/gsm8k:main:test`` -> ``gsm8k/test``)."""
    if spec.source:
        return spec.source
    if spec.path.startswith("hf:"):  # hf:openai/gsm8k:main:test -> gsm8k/test
        parts = spec.path[3:].split(":")
        return f"{PurePosixPath(parts[0].rstrip('/')).name}/{parts[-1] if len(parts) > 1 else 'train'}"
    path = PurePosixPath(spec.path.rstrip("/"))
    return f"{path.parent.name}/{path.stem}" if path.parent.name else path.stem


def parse_json_line(data: bytes, max_bytes: int) -> Any:
    """One JSON Lines record from raw bytes; failures raise FormatError with the dead-letter reason."""
    if len(data) > max_bytes:
        raise FormatError("too_large", f"record is {len(data)} bytes, the limit is {max_bytes}")
    try:
        text = data.decode("utf-8-sig")  # a byte-order mark (editors, spreadsheet exports) is not data
    except UnicodeDecodeError as error:
        raise FormatError("non_utf8", f"not UTF-8 at byte {error.start}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise FormatError("malformed_json", f"{error.msg} at line {error.lineno} column {error.colno}") from None


def csv_records(lines: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The rows of a CSV file with a header line, from its lines as bytes (a spreadsheet export: a
    byte-order mark and CRLF line ends taken as they come), as ``{"line": the line the row starts on,
    "record": {column: text}}``. A file that stops being readable (not UTF-8, a NUL byte, a broken
    quote) ends with one ``{"line": ..., "error": (reason, detail)}`` for the line where it did."""
    def text_lines():
        for number, line in enumerate(lines):
            yield line.decode("utf-8-sig" if number == 0 else "utf-8")

    reader = csv.DictReader(text_lines())
    line = 2  # the header is line 1
    try:
        for record in reader:
            extra = record.pop(None, None)  # values past the header's columns
            if extra is not None:
                yield {"line": line, "error": ("malformed_csv", f"{len(record) + len(extra)} fields; the header "
                                                                  f"names {len(record)}")}
            else:
                yield {"line": line, "record": record}
            line = reader.line_num + 1
    except UnicodeDecodeError as error:
        yield {"line": line, "error": ("non_utf8", f"not UTF-8 at byte {error.start} of the line; the file is "
                                                    "read up to here")}
    except csv.Error as error:
        yield {"line": line, "error": ("malformed_csv", f"{error}; the file is read up to here")}


def raw_text(raw: Any) -> str:
    """A raw record as text for the dead-letter file (bytes keep their undecodable parts escaped)."""
    if isinstance(raw, bytes):
        text = raw.decode("utf-8", errors="backslashreplace")
    elif isinstance(raw, str):
        text = raw
    else:
        text = json.dumps(raw, ensure_ascii=False, sort_keys=True, default=str)
    if len(text) > RAW_KEEP_CHARS:
        text = text[:RAW_KEEP_CHARS] + f"...[cut, {len(text)} chars in all]"
    return text


def dead_letter(reason: str, detail: str, raw: Any, *, source: str | None, origin: str | None,
                example_id: str | None = None, line: int | None = None, row: int | None = None) -> dict[str, Any]:
    """The dead-letter record: why a row was rejected, where it came from, and the row itself.

    ``origin`` is the file (or ``hf:`` dataset) it was read from; ``line`` its line in a JSON Lines
    or CSV file (from 1), ``row`` its index in a JSON array, parquet file or dataset (from 0); None where
    the row has no such place (a duplicate found after adaptation names its ``id`` instead).
    """
    return {"reason": reason, "detail": detail, "source": source, "origin": origin, "line": line, "row": row,
            "id": example_id, "raw": raw_text(raw)}


def stat_category(reason: str) -> str:
    """The ``stats.json`` count a dead-letter reason adds to."""
    return reason if reason in (DUPLICATE, NEAR_DUPLICATE, CONTAMINATED) else "dead_lettered"
