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


def pipeline_options(beam_args: Sequence[str], *, streaming: bool = False, **defaults) -> PipelineOptions:
    """Beam options from the command line, with RLAX's defaults for what the user did not say.

    Locally (no ``--runner`` given) streaming pipelines run on Prism, using the cached binary when
    there is one so that no download is attempted; batch pipelines use Beam's DirectRunner, which
    itself prefers Prism where the pipeline allows it. ``defaults`` are options set only when absent.
    """
    args = list(beam_args)
    if not _has_flag(args, "--runner"):
        args.append("--runner=PrismRunner" if streaming else "--runner=DirectRunner")
    # The last --runner wins, as in argparse: flags typed on the command line follow the config's.
    runner = [a.split("=", 1)[1] if "=" in a else args[i + 1] for i, a in enumerate(args)
              if a == "--runner" or a.startswith("--runner=")][-1]
    binary = cached_prism_binary()
    if runner in ("PrismRunner", "prism") and binary and not _has_flag(args, "--prism_location"):
        args.append(f"--prism_location={binary}")
    options = PipelineOptions(args, **defaults)
    if streaming:
        options.view_as(StandardOptions).streaming = True
    return options
