"""Reference answers out of worked solutions: GSM8K's ``#### N`` and the last ``\\boxed{...}``."""

from __future__ import annotations

import re


class AnswerError(ValueError):
    """A solution holds no answer that can be extracted."""


_GSM8K_MARK = re.compile(r"####\s*(.+?)\s*$", re.S)
_NUMBER = re.compile(r"^[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?$")


def gsm8k_answer(solution: str) -> str:
    """The number after the final ``####`` with thousands separators removed: ``"#### 1,234"`` -> ``"1234"``."""
    head, mark, tail = solution.rpartition("####")
    if not mark:
        raise AnswerError("no '####' answer marker")
    answer = tail.strip().rstrip(".").replace("$", "").strip()
    if not _NUMBER.match(answer):
        raise AnswerError(f"answer after '####' is not a number: {answer[:40]!r}")
    return answer.replace(",", "")


def last_boxed(text: str) -> str:
    r"""The contents of the last ``\boxed{...}`` (or ``\fbox{...}``), braces matched; ``\boxed 5`` too."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        raise AnswerError("no \\boxed{} answer")
    rest = text[start:]
    rest = rest[len("\\boxed"):] if rest.startswith("\\boxed") else rest[len("\\fbox"):]
    if rest.startswith(" "):  # "\boxed 5": the answer runs to the next white space or "$"
        answer = re.split(r"[\s$]", rest.lstrip(), maxsplit=1)[0]
        if not answer:
            raise AnswerError("empty \\boxed answer")
        return answer
    if not rest.startswith("{"):
        raise AnswerError("\\boxed is not followed by a braced answer")
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                answer = rest[1:i].strip()
                if not answer:
                    raise AnswerError("empty \\boxed{} answer")
                return answer
    raise AnswerError("unbalanced braces in \\boxed{...}")


def plain_answer(value: object) -> str:
    """A given answer as text: AMC's ``27.0`` -> ``"27"``, AIME's ``"025"`` -> ``"25"``; others stripped."""
    if value is None or isinstance(value, bool):
        raise AnswerError(f"no answer value (got {value!r})")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise AnswerError(f"answer is not finite: {value!r}")
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, int):
        return str(value)
    if not isinstance(value, str):
        raise AnswerError(f"answer is a {type(value).__name__}, not text or a number")
    text = value.strip()
    if not text:
        raise AnswerError("empty answer")
    if text.isdigit():
        return str(int(text))
    return text


EXTRACTORS = {"gsm8k": gsm8k_answer, "boxed": last_boxed, "plain": plain_answer}
