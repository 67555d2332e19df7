"""Find the final answer in a model's text: ``\\boxed{}``, ``####``, "the answer is", then the last number.

Every strategy scans the text once (no backtracking regular expressions), so a megabyte of model
output costs milliseconds, not a hang.
"""

from __future__ import annotations

import dataclasses
import re

EXTRACTION_METHODS = ("boxed", "hashes", "answer_is", "last_number")
_BOX_COMMANDS = ("\\boxed", "\\fbox")
_ANSWER_IS = re.compile(r"the (?:final )?answer is[:\s]*", re.IGNORECASE)
# Thousands may be grouped by commas, LaTeX spaces (\, \; \! {,}) or thin / no-break spaces, not by a
# plain space: in prose "3 100" is as likely two numbers as one.
_NUMBER = re.compile(r"-?\d{1,3}(?:(?:\\[,;!:]|\{,\}|[\u2009\u202f\u00a0])\d{3})+(?:\.\d+)?"
                     r"|-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


@dataclasses.dataclass(frozen=True)
class ExtractedAnswer:
    text: str
    method: str  # one of EXTRACTION_METHODS


def extract_answer(text: str, methods: tuple[str, ...] = EXTRACTION_METHODS) -> ExtractedAnswer | None:
    """The final answer by the first of ``methods`` that finds one, or None."""
    for method in methods:
        found = _EXTRACTORS[method](text)
        if found is not None and found.strip():
            return ExtractedAnswer(found.strip(), method)
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``), braces balanced."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    rest = text[start:]
    command = next(c for c in _BOX_COMMANDS if rest.startswith(c))
    rest = rest[len(command):]
    if rest.startswith(" "):  # \boxed 5: the argument runs to the next space or dollar sign
        return re.split(r"[\s$]", rest.lstrip(), maxsplit=1)[0]
    if not rest.startswith("{"):
        return None
    depth = 0
    for index, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:index]
    return None  # unbalanced: the text was cut off


def _after_hashes(text: str) -> str | None:
    index = text.rfind("####")
    if index < 0:
        return None
    return text[index + 4:].strip().split("\n", 1)[0]


def _after_answer_is(text: str) -> str | None:
    matches = list(_ANSWER_IS.finditer(text))
    if not matches:
        return None
    rest = text[matches[-1].end():].split("\n", 1)[0].strip()
    boxed = last_boxed(rest)
    if boxed is not None:
        return boxed
    # The sentence ends at a full stop followed by a space or the end (not the dot inside 3.5).
    sentence = re.split(r"\.(?:\s|$)", rest, maxsplit=1)[0]
    return sentence.strip().strip("$").strip()


def _last_number(text: str) -> str | None:
    numbers = _NUMBER.findall(text)
    return numbers[-1].rstrip(",") if numbers else None


_EXTRACTORS = {"boxed": last_boxed, "hashes": _after_hashes, "answer_is": _after_answer_is, "last_number": _last_number}
