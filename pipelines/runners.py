"""Beam runner choice: the live local streaming runner (Prism) and pass-through options for the rest.

Prism is Beam's portable local runner. Beam downloads it on first use; ``make setup`` builds the same
release from Go modules and caches it under the name Beam looks for (``scripts/setup_prism.sh``), so
it is found offline too. Streaming pipelines with slowly-updating side inputs need it locally: the
FnApiRunner computes a streaming side input to completion before the main input starts, and the
BundleBasedDirectRunner cannot run ``PeriodicImpulse`` (see DESIGN.md). The live side-input pattern
that works on Prism (and on Dataflow) is in ``transforms/live_side_input.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipelines.beam_args import has_flag, merge_beam_args

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


def runner_name(args: Sequence[str], *, streaming: bool) -> str:
    """The runner ``args`` ask for (the last ``--runner`` wins, as in argparse: flags typed on the
    command line follow the config's), or RLAX's default: Prism for streaming, else the DirectRunner."""
    named = [a.split("=", 1)[1] if "=" in a else args[i + 1] for i, a in enumerate(args)
             if a == "--runner" or a.startswith("--runner=")]
    return named[-1] if named else ("PrismRunner" if streaming else "DirectRunner")


def runs_on_local_prism(args: Sequence[str]) -> bool:
    """Whether a streaming pipeline with ``args`` would start a Prism on this machine."""
    return runner_name(args, streaming=True) in ("PrismRunner", "prism") and not has_flag(args, "--job_endpoint")


def pipeline_options(config_args: Sequence[str], command_line_args: Sequence[str] = (), *, streaming: bool = False,
                     **defaults) -> PipelineOptions:
    """Beam options of one command's job: the config's flags and the command line's (which win, key by
    key; set options merge, see :func:`pipelines.beam_args.merge_beam_args`), with RLAX's defaults for
    what neither said.

    Locally (no ``--runner`` given) streaming pipelines run on Prism, using the cached binary when
    there is one so that no download is attempted; batch pipelines use Beam's DirectRunner, which
    itself prefers Prism where the pipeline allows it. ``defaults`` are options set only when absent.
    """
    args = merge_beam_args(config_args, command_line_args)
    runner = runner_name(args, streaming=streaming)
    if runner in ("DataflowRunner", "dataflow"):
        require_worker_python()
    if not has_flag(args, "--runner"):
        args.append(f"--runner={runner}")
    binary = cached_prism_binary()
    if runner in ("PrismRunner", "prism") and binary and not has_flag(args, "--prism_location"):
        args.append(f"--prism_location={binary}")
    options = PipelineOptions(args, **defaults)
    if streaming:
        options.view_as(StandardOptions).streaming = True
    return options


# The Python of the Dataflow worker image (docker/Dockerfile: apache/beam_python3.11_sdk). The launcher
# pickles the pipeline's functions and Dataflow refuses, or workers fail to unpickle, across versions.
WORKER_PYTHON = (3, 11)


def require_worker_python(version: Sequence[int] = tuple(sys.version_info[:2])) -> None:
    """Refuse to launch a Dataflow job from a Python other than the worker image's."""
    from rlax_core.config import ConfigError

    if tuple(version[:2]) != WORKER_PYTHON:
        wanted, have = ".".join(map(str, WORKER_PYTHON)), ".".join(map(str, version[:2]))
        raise ConfigError("--runner", f"Dataflow workers run Python {wanted} (the worker image); this launcher runs "
                          f"Python {have}: launch from a Python {wanted} environment (make setup builds one)")


# ----------------------------------------------------------------------------- a Prism that dies with us


class LocalPrism:
    """A Prism job server owned by this process: ``with LocalPrism(binary) as prism:`` then run with
    ``--job_endpoint=prism.endpoint``.

    Beam starts its own Prism as a plain child, which outlives a SIGKILLed driver (orphaned, still
    listening on its port). This one is started with ``PR_SET_PDEATHSIG`` (the kernel kills it with
    its parent; the parent here is the thread that starts it, so start it from the main thread) and
    with ``TMPDIR`` pointed at ``scratch`` so whatever it writes goes where ``scratch_dir`` cleans up.
    """

    def __init__(self, binary: Path | str, scratch: Path, *, log_level: str = "warn", start_timeout_s: float = 60.0):
        self.binary, self.scratch = Path(binary), scratch
        self.log_level, self.start_timeout_s = log_level, start_timeout_s
        self.popen: subprocess.Popen | None = None
        self.endpoint = ""

    def __enter__(self) -> "LocalPrism":
        import grpc
        from apache_beam.utils.subprocess_server import pick_port

        from pipelines.lifeline import die_with_parent

        port, = pick_port(None)
        self.endpoint = f"localhost:{port}"
        command = [str(self.binary), "--job_port", str(port), "--log_level", self.log_level, "--log_kind", "text",
                   "--serve_http=false"]
        environment = {**os.environ, "TMPDIR": str(self.scratch)}
        # Its log goes where ours goes (the job's log file under `rlax launch`).
        self.popen = subprocess.Popen(command, env=environment, preexec_fn=die_with_parent(os.getpid()))
        channel = grpc.insecure_channel(self.endpoint)
        try:
            grpc.channel_ready_future(channel).result(timeout=self.start_timeout_s)
        except grpc.FutureTimeoutError:
            self.__exit__()
            raise TimeoutError(f"Prism ({self.binary}) did not serve {self.endpoint} within "
                               f"{self.start_timeout_s:.0f} s") from None
        finally:
            channel.close()
        logger.info("Prism %d serving jobs at %s", self.popen.pid, self.endpoint)
        return self

    def __exit__(self, *exc) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGINT)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=10)


@contextlib.contextmanager
def scratch_dir(name: str, root: Path | None = None) -> Iterator[Path]:
    """A temporary folder for this process (``ROOT/NAME-PID``), removed on the way out; on the way in,
    the folders of processes of the same name that are gone (killed, so they could not clean up)
    are removed too, and ``tempfile`` in this process writes into it."""
    root = Path(tempfile.gettempdir()) / "rlax-scratch" if root is None else root
    root.mkdir(parents=True, exist_ok=True)
    for leftover in root.glob(f"{name}-*"):
        pid = leftover.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _is_alive(int(pid)):
            shutil.rmtree(leftover, ignore_errors=True)
            logger.info("removed %s, left behind by a process that was killed", leftover)
    folder = root / f"{name}-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    saved = tempfile.tempdir
    tempfile.tempdir = str(folder)
    try:
        yield folder
    finally:
        tempfile.tempdir = saved
        shutil.rmtree(folder, ignore_errors=True)


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
