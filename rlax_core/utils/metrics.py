"""Metrics of long jobs: one JSON line per step (for scripts) and TensorBoard events (for people)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Mapping


class MetricsWriter:
    """Appends ``{"step": s, "time": t, **scalars}`` to ``DIR/metrics.jsonl`` and TensorBoard events.

    Non-finite values are written as JSON ``null`` so the file stays valid JSON lines.
    """

    def __init__(self, directory: str | Path, *, tensorboard: bool = True):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.directory / "metrics.jsonl", "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.directory / "tensorboard"))

    def write(self, step: int, scalars: Mapping[str, Any]) -> None:
        clean = {k: _finite_or_none(v) for k, v in scalars.items()}
        self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **clean}, sort_keys=True) + "\n")
        self._jsonl.flush()
        if self._tb is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, int(step))

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _finite_or_none(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "size", 2) == 1:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(directory: str | Path) -> list[dict[str, Any]]:
    """All rows of ``DIR/metrics.jsonl`` in order."""
    path = Path(directory) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
