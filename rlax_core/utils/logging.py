"""One logging setup for every entry point, and progress bars that stay quiet off a terminal."""

from __future__ import annotations

import logging
import os
import sys
from typing import Iterable, TypeVar

T = TypeVar("T")

_FORMAT = "%(asctime)s %(levelname).1s %(name)s: %(message)s"


class _StderrHandler(logging.StreamHandler):
    """Writes each record to ``sys.stderr`` as it is when the record is emitted, not as it was when
    logging was set up: a thread that outlives a redirection of stderr (Beam's reader of the Prism
    runner's output, after a caller captured stderr and closed the capture) logs where stderr goes
    now, instead of failing on a closed stream."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def setup_logging(level: str | int = "INFO") -> None:
    """Configure the root logger once (stderr, timestamps); quiet the chattiest libraries."""
    if isinstance(level, str):
        level = getattr(logging, level.upper(), None)
        if not isinstance(level, int):
            raise ValueError("log level must be one of DEBUG, INFO, WARNING, ERROR")
    logging.basicConfig(level=level, format=_FORMAT, datefmt="%H:%M:%S", handlers=[_StderrHandler()], force=True)
    for noisy in ("absl", "jax._src", "urllib3", "google", "fsspec", "gcsfs", "apache_beam.runners"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def show_progress() -> bool:
    """Progress bars only on an interactive terminal, never in CI or in logs."""
    return sys.stderr.isatty() and not os.environ.get("CI")


def progress(iterable: Iterable[T], *, desc: str, total: int | None = None, unit: str = "it") -> Iterable[T]:
    """``tqdm`` over ``iterable`` when a person is watching, the bare iterable otherwise."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, unit=unit, disable=not show_progress(), dynamic_ncols=True)
