"""JAX's persistent compilation cache, shared by every RLAX process on a machine.

The trainer, the rollout workers and the batch stages compile the same programs run after run (the
GRPO step, the engine's prefill and decode buckets): on 2 CPU cores that is seconds to tens of
seconds before the first useful step. With the cache, a process whose program was compiled before,
by any earlier RLAX process using the same folder, loads it from disk instead.

    from rlax_core.utils.compile_cache import enable_compilation_cache
    enable_compilation_cache(run_config.run.compilation_cache_dir, enabled=run_config.run.compilation_cache)

Call it once per process before the first compilation (JAX decides whether to use the cache at its
first compile). It is idempotent; a cache the user configured themselves (``JAX_COMPILATION_CACHE_DIR``
or ``jax.config.update("jax_compilation_cache_dir", ...)``) is kept as it is; ``enabled=False``
(``run.compilation_cache=false``) leaves JAX untouched.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from rlax_core.utils.paths import is_remote

log = logging.getLogger(__name__)

ENV_DIR = "RLAX_COMPILATION_CACHE_DIR"  # where the cache lives when the config names no folder

_configured: str | None = None  # the folder this module pointed JAX at


def default_cache_dir() -> str:
    """``$RLAX_COMPILATION_CACHE_DIR``, else ``$XDG_CACHE_HOME/rlax/jax`` (``~/.cache/rlax/jax``)."""
    if os.environ.get(ENV_DIR):
        return os.environ[ENV_DIR]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "rlax" / "jax")


def enable_compilation_cache(directory: str = "", *, enabled: bool = True) -> str | None:
    """Point JAX's persistent compilation cache at ``directory`` (default: :func:`default_cache_dir`);
    returns the folder in use (the user's own when they set one) or None when disabled."""
    global _configured
    if not enabled:
        return None
    import jax

    own = jax.config.jax_compilation_cache_dir
    if own and own != _configured:  # the user's setting wins over ours
        return own
    folder = directory or default_cache_dir()
    if _configured == folder:
        return folder
    if not is_remote(folder):
        Path(folder.removeprefix("file://")).mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", folder)
    # Every program, however small: the engine's buckets compile in well under JAX's default 1 s
    # threshold each on a CPU, yet together they are most of a rollout worker's start-up.
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # JAX decides at its first compilation whether to use a cache, once: make it decide again.
    from jax.experimental.compilation_cache import compilation_cache

    compilation_cache.reset_cache()
    _configured = folder
    log.info("JAX compilation cache: %s", folder)
    return folder
