"""Metrics of long jobs: one JSON line per step (for scripts) and TensorBoard events (for people).

The folder may be local or a URL (``gs://bucket/run/metrics``): object stores cannot append, so there
the whole ``metrics.jsonl`` is rewritten after each step (it stays small: one line per step), and
TensorBoard's event files are written to a local temporary folder and copied up after each step
(tensorboardX's own ``gs://`` writer uploads again when it is garbage-collected, after ``close``).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Mapping

from rlax_core.utils.paths import is_remote, join


class MetricsWriter:
    """Appends ``{"step": s, "time": t, **scalars}`` to ``DIR/metrics.jsonl`` and TensorBoard events.

    Non-finite values are written as JSON ``null`` so the file stays valid JSON lines.

    ``resumed_from``: the step a resumed job restarts after. A job writes a step's row as soon as
    the step is done, but its checkpoint may not have become durable before the job died; the
    steps after the checkpoint it resumes from are trained again. Their old rows (and TensorBoard
    events) are dropped on opening, so every step has one row, from the life that kept it.
    """

    def __init__(self, directory: str | Path, *, tensorboard: bool = True, resumed_from: int | None = None):
        self.directory = str(directory)
        self._remote = is_remote(self.directory)
        if self._remote:
            import fsspec

            self._fs, self._path = fsspec.core.url_to_fs(join(self.directory, "metrics.jsonl"))
            # A restarted job continues the file: earlier steps stay.
            try:
                lines = self._fs.cat_file(self._path).decode("utf-8").splitlines(keepends=True)
            except FileNotFoundError:
                lines = []
            self._lines = lines if resumed_from is None else _rows_up_to(lines, resumed_from)
            if len(self._lines) != len(lines):
                self._fs.pipe_file(self._path, "".join(self._lines).encode("utf-8"))
        else:
            Path(self.directory).mkdir(parents=True, exist_ok=True)
            path = Path(self.directory) / "metrics.jsonl"
            if resumed_from is not None and path.exists():
                _drop_rows_after(path, resumed_from)
            self._jsonl = open(path, "a", encoding="utf-8")
        self._tb = None
        self._tb_local = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            if self._remote:
                import tempfile

                self._tb_local = tempfile.TemporaryDirectory(prefix="rlax-tensorboard-")
            purge = {} if resumed_from is None else {"purge_step": resumed_from + 1}
            self._tb = SummaryWriter(self._tb_local.name if self._tb_local else join(self.directory, "tensorboard"),
                                     **purge)

    def write(self, step: int, scalars: Mapping[str, Any]) -> None:
        clean = {k: _finite_or_none(v) for k, v in scalars.items()}
        line = json.dumps({"step": int(step), "time": time.time(), **clean}, sort_keys=True) + "\n"
        if self._remote:
            self._lines.append(line)
            self._fs.pipe_file(self._path, "".join(self._lines).encode("utf-8"))
        else:
            self._jsonl.write(line)
            self._jsonl.flush()
        if self._tb is not None:
            for key, value in clean.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self._tb.add_scalar(key, value, int(step))
            if self._tb_local is not None:
                self._upload_events()

    def _upload_events(self) -> None:
        self._tb.flush()
        for local in sorted(Path(self._tb_local.name).iterdir()):
            self._fs.put_file(str(local), join(self._path.rsplit("/", 1)[0], "tensorboard", local.name))

    def close(self) -> None:
        if not self._remote:
            self._jsonl.close()
        if self._tb is not None:
            if self._tb_local is not None:
                self._upload_events()
            self._tb.close()
            if self._tb_local is not None:
                self._tb_local.cleanup()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _drop_rows_after(path: Path, step: int) -> None:
    """Rewrite ``path`` without the rows of steps after ``step`` (atomically: a crash keeps the old file)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = _rows_up_to(lines, step)
    if len(kept) == len(lines):
        return
    partial = path.with_suffix(".jsonl.partial")
    partial.write_text("".join(kept), encoding="utf-8")
    os.replace(partial, path)


def _rows_up_to(lines: list[str], step: int) -> list[str]:
    return [line for line in lines if not line.strip() or json.loads(line).get("step", step) <= step]


def _finite_or_none(value: Any) -> Any:
    if hasattr(value, "item") and getattr(value, "size", 2) == 1:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def read_metrics(directory: str | Path) -> list[dict[str, Any]]:
    """All rows of ``DIR/metrics.jsonl`` in order (a local folder or a URL)."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(join(directory, "metrics.jsonl"))
    try:  # cat, not exists: a listing may be cached while another process writes the file
        text = fs.cat_file(path).decode("utf-8")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]
