"""A run folder belongs to one run: checked before any heavy import, refused when another run is in it.

``rlax quickstart --output DIR`` and ``rlax launch`` (its ``run.output_dir``) start a run in a folder.
A folder that already holds files is another run's (or something else's): starting there would mix
the new run's shards, checkpoints and metrics with the old ones, so it is refused unless the user asks
to continue that run (``--resume``). A folder that cannot be created or written is reported at once,
not after a minute of imports. Remote folders (``gs://``...) are checked when first written.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from rlax_core.config import ConfigError
from rlax_core.utils.paths import is_remote


def claim(path: str | Path, *, resume: bool, flag: str = "--output") -> bool:
    """Make ``path`` ready for a run; returns True when it continues a run already there.

    Raises ``ConfigError`` (one line, naming ``flag``) when the folder is unusable, or holds files and
    ``resume`` is false.
    """
    if is_remote(str(path)):
        return resume
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(flag, f"{folder} is a file, not a folder")
    used = folder.is_dir() and any(folder.iterdir())
    if used and not resume:
        raise ConfigError(flag, f"{folder} already holds a run ({', '.join(sorted(p.name for p in folder.iterdir())[:5])}); "
                                "choose another folder, or pass --resume to continue that run")
    writable(folder, flag)
    return used


def writable(path: str | Path, flag: str = "--output") -> None:
    """Create the local folder ``path`` if needed and check that files can be written in it."""
    if is_remote(str(path)):
        return
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ConfigError(flag, f"{folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-check-"):
            pass
    except OSError as error:
        raise ConfigError(flag, f"cannot write to {folder}: {error.strerror or error}") from None
