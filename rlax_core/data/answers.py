"""Reference answers out of worked solutions: GSM8K's ``#### N`` and the last ``\\boxed{...}``."""

from __future__ import annotations

import re


class AnswerError(ValueError):
    """A solution holds no answer that can be extracted."""


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
    r"""The contents of the last ``\boxed{...}`` (or ``\fbox{...}``, ``\boxed 5``) of a reference solution.

    The scan is the verifiers' (``rlax_core.rewards.answers``), so references and model answers are
    read by one rule; here a missing or empty box is an error, since a reference must have an answer.
    """
    from rlax_core.rewards.answers import last_boxed as find_last_boxed

    answer = find_last_boxed(text)
    if answer is None:
        raise AnswerError("no \\boxed{} answer")
    if not answer.strip():
        raise AnswerError("empty \\boxed{} answer")
    return answer.strip()


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
