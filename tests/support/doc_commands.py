"""The commands a Markdown document writes: each line of its fenced ``bash`` blocks, and each inline
code span that holds a command with an option (`python benchmarks/x.py --sizes 25m`; a bare
`rlax plan` in prose names a command, it does not give one)."""

from __future__ import annotations

import re
from pathlib import Path

_START = ("rlax ", "python ", ".venv/bin/python ")


def markdown_commands(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    found = []
    for body in re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M):
        joined = re.sub(r"\s*\\\n\s*", " ", body)
        found += [line.partition("  #")[0].strip() for line in joined.splitlines() if line.startswith(_START)]
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    found += [span for span in re.findall(r"`([^`\n]+)`", prose) if span.startswith(_START) and " -" in span]
    return found
