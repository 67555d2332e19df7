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


def rollout_metrics_dir(rollout_root: str | os.PathLike, run: str, *parts: str) -> str:
    """``ROOT/RUN-metrics[/PART...]``: the rollout side's files of ``run`` beside its rollout store (step
    metrics, start-up stamps, busy notices); the one place that knows this layout."""
    return join(f"{str(rollout_root).rstrip('/')}/{run}-metrics", *parts)
