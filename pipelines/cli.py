"""The ``rlax`` command line: one subcommand per entry point.

Each subcommand lives in its own module ``pipelines/<name>.py`` exposing

    HELP: str                                  one line for ``rlax --help``
    add_arguments(parser: ArgumentParser)      its own flags
    run(args: Namespace, beam_args: list[str]) -> int

Flags the subcommand does not know (Beam's ``--runner``, ``--project``, ``--region``,
``--temp_location``, ...) are passed through untouched as ``beam_args``. ``--config`` and trailing
``key=value`` overrides are common to all subcommands; ``pipelines.config.load_run_config`` turns
them into the typed run configuration.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from rlax_core.config import ConfigError, InputError

# name -> (module, one-line summary shown when the module has not landed yet)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "quickstart": ("pipelines.quickstart", "curate -> filter -> RL -> evaluate on stories260K, all on this machine"),
    "curate": ("pipelines.curate", "Beam batch: normalise, dedup and decontaminate raw datasets"),
    "filter": ("pipelines.filter_difficulty", "Beam batch: keep prompts whose pass rate lies in a band"),
    "evaluate": ("pipelines.evaluate", "Beam batch: pass@k, maj@k and lengths of a checkpoint on eval sets"),
    "generate": ("pipelines.generate", "generate text from a model (greedy or sampled)"),
    "train": ("pipelines.train", "the JAX trainer job: learn from rollout groups, publish weights"),
    "rollout": ("pipelines.rl_stream", "Beam streaming: generate and score rollouts with the latest weights"),
    "launch": ("pipelines.launch", "run the trainer and the rollout pipeline together on this machine"),
    "plan": ("pipelines.plan", "memory per chip of the rollout engine and the trainer against the declared hardware"),
}

OVERRIDE = re.compile(r"^[A-Za-z_][\w.-]*=")

EPILOG = """\
Every subcommand takes --config FILE and dotted overrides (trainer.learning_rate=1e-5), and passes
Beam's own options (--runner, --project, --region, --temp_location, ...) through to Beam.
Start with `rlax quickstart --output runs/quickstart`."""


class _NotLanded:
    """Stands in for a subcommand whose module is not part of this build, and says so plainly."""

    def __init__(self, name: str, summary: str):
        self.HELP = f"{summary} (not available yet)"
        self.name = name

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        pass

    def run(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        print(f"rlax {self.name}: this entry point is not part of this build yet.", file=sys.stderr)
        return 2


def _load(name: str):
    module_name, summary = SUBCOMMANDS[name]
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name != module_name:
            raise
        return _NotLanded(name, summary)


def _version() -> str:
    """The installed distribution's version (setup.py's), and where the package runs from."""
    from importlib import metadata
    from pathlib import Path

    try:
        version = metadata.version("rlax-beam")
    except metadata.PackageNotFoundError:
        version = "(not installed)"
    return f"{version} ({Path(__file__).resolve().parent})"


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; ``only`` loads just that subcommand's module (the others show a summary)."""
    parser = argparse.ArgumentParser(
        prog="rlax",
        description="RLAX on Beam: preemptible RL for LLM reasoning on JAX, orchestrated with Apache Beam.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    parser.add_argument("--version", action="version", version=f"rlax {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (_, summary) in SUBCOMMANDS.items():
        module = _load(name) if only in (None, name) else None
        help_text = getattr(module, "HELP", summary) if module else summary
        sub = subparsers.add_parser(name, help=help_text, description=help_text, epilog=EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("--config", help="YAML run configuration (see configs/)")
        if module is not None:
            module.add_arguments(sub)
            sub.set_defaults(_module=module)
    return parser


def _bare_words(extra: list[str]) -> list[str]:
    """Words left over that are neither a flag nor a flag's value: a ``key=value`` without its ``=``."""
    return [word for i, word in enumerate(extra) if not word.startswith("-")
            and not (i and extra[i - 1].startswith("--") and "=" not in extra[i - 1])]


def main(argv: list[str] | None = None) -> int:
    from pipelines import lifeline

    lifeline.hold()  # a job of `rlax launch` / `rlax quickstart` dies with it (before any slow import)
    argv = list(sys.argv[1:] if argv is None else argv)
    # key=value words are config overrides wherever they stand; taking them out first keeps Beam's
    # "--runner DirectRunner" pairs intact for parse_known_args.
    overrides = [a for a in argv if OVERRIDE.match(a)]
    argv = [a for a in argv if not OVERRIDE.match(a)]
    command = next((a for a in argv if not a.startswith("-")), None)
    # `rlax --version` loads no subcommand (their modules import JAX and Beam: seconds to a minute).
    parser = build_parser(only=command if command in SUBCOMMANDS else ("" if "--version" in argv else None))
    args, beam_args = parser.parse_known_args(argv)
    args.overrides = overrides
    if args.command is None:
        parser.print_help()
        return 0
    from rlax_core.utils.logging import setup_logging

    setup_logging(args.log_level)
    # The one place where a command's bad configuration or missing / unreadable input becomes one
    # line and a non-zero exit, not a traceback (--log-level DEBUG shows the traceback too).
    try:
        bare = _bare_words(beam_args)
        if bare:
            raise ConfigError("", f"{bare[0]!r} is neither a flag nor an override; overrides are dotted "
                                  f"key=value words, e.g. trainer.optimizer.learning_rate=1e-5")
        return int(args._module.run(args, beam_args) or 0)
    except ConfigError as error:
        return _fail(args.command, "config error", error)
    except (InputError, OSError) as error:  # OSError: a file that is missing, unreadable, or not what it claims
        return _fail(args.command, "input error", error)
    except KeyboardInterrupt:
        print(f"rlax {args.command}: interrupted", file=sys.stderr)
        return 130


def _fail(command: str, kind: str, error: Exception) -> int:
    import logging

    logging.getLogger(__name__).debug("%s", kind, exc_info=True)
    message = " ".join(str(error).split()) or type(error).__name__
    print(f"rlax {command}: {kind}: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
