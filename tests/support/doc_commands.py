"""The commands documents write, for the tests that run them.

``fenced_blocks`` and ``joined_lines`` are the parsing every such test shares (fences, ``\\``
continuations); ``markdown_commands`` is a page's commands as docs/lora.md's tests take them: each
line of its fenced ``bash`` blocks, and each inline code span that holds a command with an option
(`python benchmarks/x.py --sizes 25m`; a bare `rlax plan` in prose names a command, it does not give one)."""

from __future__ import annotations

import re
from pathlib import Path

_START = ("rlax ", "python ", ".venv/bin/python ")
_FENCE = re.compile(r"^\s*```(\w*)\n(.*?)^\s*```", flags=re.S | re.M)


def fenced_blocks(text: str, language: str | None = None) -> list[str]:
    """The bodies of ``text``'s fenced blocks (of ``language`` only, when given)."""
    return [body for tag, body in _FENCE.findall(text) if language is None or tag == language]


def joined_lines(text: str) -> list[str]:
    """``text``'s non-blank lines, stripped, with ``\\``-continued lines joined into one."""
    return [line.strip() for line in re.sub(r"\s*\\\n\s*", " ", text).splitlines() if line.strip()]


def markdown_commands(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    found = [line.partition("  #")[0].strip() for body in fenced_blocks(text, "bash") for line in joined_lines(body)
             if line.startswith(_START)]
    prose = _FENCE.sub("", text)
    found += [span for span in re.findall(r"`([^`\n]+)`", prose) if span.startswith(_START) and " -" in span]
    return found
