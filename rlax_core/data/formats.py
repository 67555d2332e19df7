"""Adapters: one function per dataset layout that turns a raw record (a dict) into an Example row.

Built in: GSM8K, MATH (also MATH-500), AIME, AMC, HumanEval, MBPP, Spider and BIRD (text-to-SQL,
``sql_format``), and ``generic`` (a field mapping
given in the config). ``auto`` picks a built-in layout from the record's fields. Every failure is
an :class:`FormatError` whose ``reason`` names the dead-letter category.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Literal, Mapping

from rlax_core.config import require
from rlax_core.data.format_error import FormatError
from rlax_core.data.answers import EXTRACTORS, AnswerError, gsm8k_answer, last_boxed, plain_answer
from rlax_core.data.records import EXAMPLE_FIELDS, example_id, make_example


@dataclasses.dataclass(frozen=True)
class FieldMapping:
    """The ``generic`` adapter: which raw fields hold the prompt, the answer and the metadata."""

    prompt: str = "prompt"
    answer: str | None = "answer"
    answer_format: Literal["plain", "gsm8k", "boxed"] = "plain"  # how to read the answer field
    task: str = "math"
    meta_fields: tuple[str, ...] = ()

    def __post_init__(self):
        require(bool(self.prompt), "prompt", "name the raw field that holds the prompt")
        require(self.answer is None or bool(self.answer), "answer", "a raw field name, or null for no answer")


def _text_field(raw: Mapping[str, Any], name: str) -> str:
    if name not in raw or raw[name] is None:
        raise FormatError("missing_field", f"field {name!r} is missing (fields: {sorted(raw)[:12]})")
    value = raw[name]
    if not isinstance(value, str):
        raise FormatError("bad_field", f"field {name!r} is a {type(value).__name__}, expected text")
    if not value.strip():
        raise FormatError("missing_field", f"field {name!r} is empty")
    return value


def _answer(extract: Callable[[Any], str], value: Any) -> str:
    try:
        return extract(value)
    except AnswerError as error:
        raise FormatError("unparseable_answer", str(error)) from None


def _level(value: Any) -> int | None:
    """MATH levels come as 3 or "Level 3"; "Level ?" exists in the raw data and means unknown."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = re.search(r"\d+", str(value or ""))
    return int(match.group()) if match else None


def gsm8k(raw: Mapping[str, Any], source: str, split: str | None) -> dict[str, Any]:
    prompt = _text_field(raw, "question")
    return make_example(source=source, split=split, prompt=prompt, task="math",
                        answer=_answer(gsm8k_answer, _text_field(raw, "answer")))


def math(raw: Mapping[str, Any], source: str, split: str | None) -> dict[str, Any]:
    prompt = _text_field(raw, "problem")
    given = raw.get("answer")
    if isinstance(given, str) and given.strip():
        answer = given.strip()
    else:  # MATH test and a few MATH train rows carry the answer only inside the solution
        answer = _answer(last_boxed, _text_field(raw, "solution"))
    meta = {"subject": raw.get("subject") or raw.get("type"), "level": _level(raw.get("level"))}
    for key in ("unique_id", "idx"):
        if raw.get(key) is not None:
            meta[key] = raw[key]
    return make_example(source=source, split=split, prompt=prompt, task="math", answer=answer, meta=meta)


def competition(raw: Mapping[str, Any], source: str, split: str | None) -> dict[str, Any]:
    """AIME and AMC: a problem and a short (numeric) answer."""
    prompt = _text_field(raw, "problem")
    if "answer" not in raw:
        raise FormatError("missing_field", "field 'answer' is missing")
    meta = {key: raw[key] for key in ("id", "url") if raw.get(key) is not None}
    return make_example(source=source, split=split, prompt=prompt, task="math",
                        answer=_answer(plain_answer, raw["answer"]), meta=meta)


def humaneval(raw: Mapping[str, Any], source: str, split: str | None) -> dict[str, Any]:
    prompt = _text_field(raw, "prompt")
    tests = {"test": _text_field(raw, "test"), "entry_point": _text_field(raw, "entry_point")}
    return make_example(source=source, split=split, prompt=prompt, task="code",
                        answer=_text_field(raw, "canonical_solution"), tests=tests,
                        meta={"task_id": raw.get("task_id")})


def mbpp(raw: Mapping[str, Any], source: str, split: str | None) -> dict[str, Any]:
    prompt = _text_field(raw, "text" if "text" in raw else "prompt")  # full MBPP says text, sanitized says prompt
    test_list = raw.get("test_list")
    if not isinstance(test_list, list) or not test_list or not all(isinstance(t, str) for t in test_list):
        raise FormatError("missing_field", "field 'test_list' must be a non-empty list of assert statements")
    tests = {"test_list": test_list, "test_setup_code": raw.get("test_setup_code") or "",
             "test_imports": raw.get("test_imports") or []}
    return make_example(source=source, split=split, prompt=prompt, task="code", answer=_text_field(raw, "code"),
                        tests=tests, meta={"task_id": raw.get("task_id")})


def generic(raw: Mapping[str, Any], source: str, split: str | None, mapping: FieldMapping) -> dict[str, Any]:
    prompt = _text_field(raw, mapping.prompt)
    answer = None
    if mapping.answer is not None:
        if raw.get(mapping.answer) is None:
            raise FormatError("missing_field", f"field {mapping.answer!r} is missing")
        answer = _answer(EXTRACTORS[mapping.answer_format], raw[mapping.answer])
    meta = {key: raw.get(key) for key in mapping.meta_fields}
    return make_example(source=source, split=split, prompt=prompt, task=mapping.task, answer=answer, meta=meta)


def example(raw: Mapping[str, Any], source: str, split: str | None) -> dict[str, Any]:
    """A row that is already an Example (curate's output, task generators): checked and completed."""
    prompt, task = _text_field(raw, "prompt"), _text_field(raw, "task")
    row = {name: raw.get(name) for name in EXAMPLE_FIELDS}
    row["source"] = raw.get("source") or source
    row["id"] = raw.get("id") or example_id(row["source"], prompt)
    row["split"] = raw.get("split") or split
    row["meta"] = raw.get("meta") or "{}"
    if not isinstance(row["meta"], str):
        raise FormatError("bad_field", "field 'meta' must be a JSON-encoded object")
    row["prompt"], row["task"] = prompt, task
    return row


ADAPTERS: dict[str, Callable[[Mapping[str, Any], str, str | None], dict[str, Any]]] = {
    "gsm8k": gsm8k,
    "math": math,
    "math500": math,
    "aime": competition,
    "amc": competition,
    "humaneval": humaneval,
    "mbpp": mbpp,
    "example": example,
}
SQL_FORMATS = ("spider", "bird")  # need a folder of databases: rlax_core.data.sql_format
FORMATS = (*ADAPTERS, *SQL_FORMATS, "generic", "auto")


def detect_format(raw: Mapping[str, Any]) -> str:
    """The built-in layout whose fields this record has (``auto``)."""
    keys = set(raw)
    if {"prompt", "task", "source"} <= keys:
        return "example"
    if {"db_id", "question"} <= keys:
        return "bird" if "SQL" in keys else "spider"
    if {"task_id", "canonical_solution", "entry_point"} <= keys:
        return "humaneval"
    if "test_list" in keys and "code" in keys:
        return "mbpp"
    if {"question", "answer"} <= keys and "problem" not in keys:
        return "gsm8k"
    if "problem" in keys and ("solution" in keys and ("level" in keys or "type" in keys or "subject" in keys)):
        return "math"
    if {"problem", "answer"} <= keys:
        return "aime"
    raise FormatError("unknown_format", f"no built-in layout has fields {sorted(keys)[:12]}")


def to_example(fmt: str, raw: Any, *, source: str | None = None, split: str | None = None,
               mapping: FieldMapping | None = None, databases: str | None = None,
               prompts_only: bool = False, schema_rows: int = 0) -> dict[str, Any]:
    """``raw`` as an Example row in layout ``fmt``; ``source`` defaults to the layout's name.

    ``databases``: the folder of SQLite databases a ``spider`` / ``bird`` input's rows run on.
    ``prompts_only``: an evaluation set read for decontamination; a SQL row's database is not needed.
    ``schema_rows``: a SQL row's prompt shows this many rows of each table under the schema.
    """
    if not isinstance(raw, Mapping):
        raise FormatError("not_an_object", f"record is a {type(raw).__name__}, expected a JSON object")
    if fmt == "auto":
        fmt = detect_format(raw)
    if fmt == "generic":
        return generic(raw, source or "generic", split, mapping or FieldMapping())
    if fmt in SQL_FORMATS:
        from rlax_core.data.sql_format import sql_example, sql_question  # only SQL inputs need the sandbox

        if prompts_only:
            return sql_question(raw, source or fmt, split)
        return sql_example(raw, source or fmt, split, databases, schema_rows)
    if fmt not in ADAPTERS:
        raise ValueError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}")
    return ADAPTERS[fmt](raw, source or fmt, split)
