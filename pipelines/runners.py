"""Beam runner choice: the live local streaming runner (Prism) and pass-through options for the rest.

Prism is Beam's portable local runner. Beam downloads it on first use; ``make setup`` builds the same
release from Go modules and caches it under the name Beam looks for (``scripts/setup_prism.sh``), so
it is found offline too. Streaming pipelines with slowly-updating side inputs need it locally: the
FnApiRunner computes a streaming side input to completion before the main input starts, and the
BundleBasedDirectRunner cannot run ``PeriodicImpulse`` (see DESIGN.md). The live side-input pattern
that works on Prism (and on Dataflow) is in ``transforms/live_side_input.py``.
"""

from __future__ import annotations

import logging
import platform
from pathlib import Path
from typing import Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

logger = logging.getLogger(__name__)

BEAM_PRISM_CACHE = Path.home() / ".apache_beam" / "cache" / "prism" / "bin"


def prism_release_name() -> str:
    """The file name Beam downloads for this Beam version and platform."""
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    return f"apache_beam-v{beam.__version__}-prism-{platform.system().lower()}-{arch}"


def cached_prism_binary() -> Path | None:
    """The Prism binary in Beam's cache (built by ``scripts/setup_prism.sh`` or downloaded by Beam)."""
    binary = BEAM_PRISM_CACHE / prism_release_name()
    return binary if binary.is_file() else None


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _flag_groups(args: Sequence[str]) -> list[tuple[str | None, list[str]]]:
    """``[(key, tokens)]``: ``--key=value``, ``--key value`` and ``--flag`` each one group; a stray word alone."""
    groups: list[tuple[str | None, list[str]]] = []
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--") or token == "--":
            groups.append((None, [token]))
            i += 1
            continue
        name = token[2:].split("=", 1)[0].replace("-", "_")
        takes_next = "=" not in token and i + 1 < len(args) and not args[i + 1].startswith("--")
        groups.append((name, list(args[i:i + 1 + takes_next])))
        i += 1 + takes_next
    return groups


def merge_beam_args(config_args: Sequence[str], command_line_args: Sequence[str]) -> list[str]:
    """The config's Beam flags and the command line's, merged key by key; the command line wins.

    A key given on the command line replaces every value the config gave it (a repeated flag such
    as ``--dataflow_service_options`` too); the config's other keys stay. ``--key value`` and
    ``--key=value`` are the same key, and so are ``--job-server-timeout`` and ``--job_server_timeout``.
    """
    command_line = _flag_groups(command_line_args)
    given = {key for key, _ in command_line if key}
    merged = [token for key, tokens in _flag_groups(config_args) if key not in given for token in tokens]
    return merged + [token for _, tokens in command_line for token in tokens]


def pipeline_options(config_args: Sequence[str], command_line_args: Sequence[str] = (), *, streaming: bool = False,
                     **defaults) -> PipelineOptions:
    """Beam options of one command's job: the config's flags and the command line's (which win, key by
    key, see :func:`merge_beam_args`), with RLAX's defaults for what neither said.

    Locally (no ``--runner`` given) streaming pipelines run on Prism, using the cached binary when
    there is one so that no download is attempted; batch pipelines use Beam's DirectRunner, which
    itself prefers Prism where the pipeline allows it. ``defaults`` are options set only when absent.
    """
    args = merge_beam_args(config_args, command_line_args)
    if not _has_flag(args, "--runner"):
        args.append("--runner=PrismRunner" if streaming else "--runner=DirectRunner")
    runner = [a.split("=", 1)[1] if "=" in a else args[i + 1] for i, a in enumerate(args)
              if a == "--runner" or a.startswith("--runner=")][-1]
    binary = cached_prism_binary()
    if runner in ("PrismRunner", "prism") and binary and not _has_flag(args, "--prism_location"):
        args.append(f"--prism_location={binary}")
    options = PipelineOptions(args, **defaults)
    if streaming:
        options.view_as(StandardOptions).streaming = True
    return options


def require_input(path: str, what: str) -> None:
    """Fail before a pipeline starts when ``path`` (file, folder or glob; local or gs://) names nothing.

    A Beam pipeline would otherwise meet the missing input on a worker, minutes later and many log
    lines deep, or (an input that every row fails to adapt) finish "successfully" with nothing.
    """
    from apache_beam.io.filesystems import FileSystems

    from rlax_core.config import InputError

    if path.startswith("hf:"):
        return  # a Hugging Face hub name: only the reader can tell
    try:
        found = FileSystems.exists(path) or any(m.metadata_list for m in FileSystems.match([path]))
    except Exception as error:  # noqa: BLE001 - a malformed glob or an unreachable bucket: say which input
        raise InputError(f"{what} {path}: cannot be read ({' '.join(str(error).split())})") from None
    if not found:
        raise InputError(f"{what} {path}: no such file or folder")


def require_model(spec: str) -> None:
    """:func:`require_input` for a model: a checkpoint path, ``weights:STORE[@V]`` or ``checkpoint:DIR[@STEP]``."""
    from rlax_core.training.policy_source import parse_policy_source

    require_input(parse_policy_source(spec).path, "model")
