"""Metrics of long jobs: one JSON line per step (for scripts) and TensorBoard events (for people)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping


class MetricsWriter:
    """Appends ``{"step": s, "time": t, **scalars}`` to ``DIR/metrics.jsonl`` and TensorBoard events.

    Non-finite values are written as JSON ``null`` so the file stays valid JSON lines.

    ``resumed_from``: the step a resumed job restarts after. A job writes a step's row as soon as
    the step is done, but its checkpoint may not have become durable before the job died; the
    steps after the checkpoint it resumes from are trained again. Their old rows (and TensorBoard
    events) are dropped on opening, so every step has one row, from the life that kept it.
    """

    def __init__(self, directory: str | Path, *, tensorboard: bool = True, resumed_from: int | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / "metrics.jsonl"
        if resumed_from is not None and path.exists():
            _drop_rows_after(path, resumed_from)
        self._jsonl = open(path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = {} if resumed_from is None else {"purge_step": resumed_from + 1}
            self._tb = SummaryWriter(str(self.directory / "tensorboard"), **purge)

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


def _drop_rows_after(path: Path, step: int) -> None:
    """Rewrite ``path`` without the rows of steps after ``step`` (atomically: a crash keeps the old file)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if not line.strip() or json.loads(line).get("step", step) <= step]
    if len(kept) == len(lines):
        return
    partial = path.with_suffix(".jsonl.partial")
    partial.write_text("".join(kept), encoding="utf-8")
    os.replace(partial, path)


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
