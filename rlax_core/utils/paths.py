"""Paths that are local folders or URLs (``gs://bucket/prefix``): joined as strings, never through
``pathlib`` (``Path("gs://b/x")`` collapses the ``//`` and writes to a local folder named ``gs:``)."""

from __future__ import annotations

import os


def is_remote(path: str | os.PathLike) -> bool:
    text = str(path)
    return "://" in text and not text.startswith("file://")


def join(base: str | os.PathLike, *parts: str) -> str:
    """``base/part/...`` for a local folder or a URL."""
    text = str(base)
    for part in parts:
        text = f"{text.rstrip('/')}/{part.lstrip('/')}"
    return text
