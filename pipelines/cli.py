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
import contextlib
import importlib
import io
import re
import sys

from rlax_core.config import ConfigError, InputError

# name -> the module that implements it; its ``HELP`` is the one summary of the command
SUBCOMMANDS: dict[str, str] = {
    "quickstart": "pipelines.quickstart",
    "curate": "pipelines.curate",
    "filter": "pipelines.filter_difficulty",
    "rft": "pipelines.rft",
    "evaluate": "pipelines.evaluate",
    "generate": "pipelines.generate",
    "train": "pipelines.train",
    "rollout": "pipelines.rl_stream",
    "launch": "pipelines.launch",
    "plan": "pipelines.plan",
    "compile": "pipelines.compile",
    "upcycle": "pipelines.upcycle",
    "sft": "pipelines.sft",
    "dpo": "pipelines.dpo",
    "rm": "pipelines.rm",
}

OVERRIDE = re.compile(r"^[A-Za-z_][\w.-]*=")

# Every override written here is parsed against RunConfig by tests/pipelines/test_cli.py.
OVERRIDE_EXAMPLE = "trainer.optimizer.learning_rate=1e-5"
EPILOG = f"""\
Every subcommand takes --config FILE (a file, or a shipped recipe by name: quickstart) and dotted
overrides ({OVERRIDE_EXAMPLE}), and passes Beam's own options (--runner, --project, --region,
--temp_location, ...) through to Beam.
Start with `rlax quickstart --output runs/quickstart`."""


DEBUG_HELP = "on a failure, show the traceback before the one line that says why (or set RLAX_DEBUG=1)"


def summary(name: str) -> str:
    """The ``HELP`` line of a subcommand's module, read from its source: its modules import JAX and
    Beam (seconds to a minute), which ``rlax --help`` does not need."""
    import ast
    import importlib.util

    origin = importlib.util.find_spec(SUBCOMMANDS[name]).origin
    with open(origin, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), origin)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "HELP" for t in node.targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{origin} has no HELP line")


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
    """The full parser; ``only`` loads just that subcommand's module (the others show their summary)."""
    parser = argparse.ArgumentParser(
        prog="rlax",
        description="RLAX on Beam: preemptible RL for LLM reasoning on JAX, orchestrated with Apache Beam.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default INFO)")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    parser.add_argument("--version", action="version", version=f"rlax {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name) if only in (None, name) else None
        help_text = module.HELP if module else summary(name)
        sub = subparsers.add_parser(name, help=help_text, description=help_text, epilog=EPILOG,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("--config", help="YAML run configuration (see configs/)")
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
        if module is not None:
            module.add_arguments(sub)
            sub.set_defaults(_module=module)
    parser.subcommands = subparsers.choices
    return parser


def overrides_of(argv: list[str], parser: argparse.ArgumentParser) -> list[bool]:
    """Which words of ``argv`` are config overrides: ``key=value`` words that are not the value of the
    flag before them. Whether a flag takes a value is asked of its parser (rlax's, else Beam's), so
    ``--opt=k=v`` and ``--opt "k=v"`` mean the same whatever the quoting."""
    found = []
    for i, word in enumerate(argv):
        before = argv[i - 1] if i else ""
        found.append(bool(OVERRIDE.match(word)) and not (
            before.startswith("--") and "=" not in before and _takes_value(parser, argv, before)))
    return found


_PROBE = "rlax-probe-value"


def _takes_value(parser: argparse.ArgumentParser, argv: list[str], flag: str) -> bool:
    """Whether ``flag`` reads the next word as its value: rlax's own flags by their parser, the rest as
    Beam reads them (a flag Beam does not know takes the next word too, as Beam passes it on)."""
    command = next((a for a in argv if a in SUBCOMMANDS), None)
    for candidate in (parser, parser.subcommands.get(command)) if command else (parser,):
        if flag in candidate._option_string_actions:  # argparse keeps no public lookup of one flag
            return candidate._option_string_actions[flag].nargs != 0
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    beam = _BeamArgumentParser(allow_abbrev=False)
    for options in PipelineOptions.__subclasses__():
        options._add_argparse_args(beam)  # as PipelineOptions.get_all_options builds its parser
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            _, unknown = beam.parse_known_args([flag, _PROBE])
    except SystemExit:  # the flag read the probe as its value and refused it (an integer flag, say)
        return True
    return flag in unknown or _PROBE not in unknown


def _bare_words(extra: list[str]) -> list[str]:
    """Words left over that are neither a flag nor a flag's value: a ``key=value`` without its ``=``."""
    return [word for i, word in enumerate(extra) if not word.startswith("-")
            and not (i and extra[i - 1].startswith("--") and "=" not in extra[i - 1])]


def main(argv: list[str] | None = None) -> int:
    from pipelines import lifeline

    lifeline.hold()  # a job of `rlax launch` / `rlax quickstart` dies with it (before any slow import)
    argv = list(sys.argv[1:] if argv is None else argv)
    given = list(argv)
    command = next((a for a in argv if not a.startswith("-") and not OVERRIDE.match(a)), None)
    # `rlax --help` and `rlax --version` load no subcommand (their modules import JAX and Beam).
    parser = build_parser(only=command if command in SUBCOMMANDS else "")
    # key=value words are config overrides wherever they stand, but for a flag's value
    # (--dataflow_service_options "worker_accelerator=..."); taking them out first keeps Beam's
    # "--runner DirectRunner" pairs intact for parse_known_args.
    is_override = overrides_of(argv, parser)
    overrides = [a for a, override in zip(argv, is_override) if override]
    argv = [a for a, override in zip(argv, is_override) if not override]
    args, beam_args = parser.parse_known_args(argv)
    args.overrides = overrides
    args.argv = given  # the whole command line: a batch command's output folder records how to run it again
    if args.command is None:
        parser.print_help()
        return 0
    from rlax_core.utils.logging import setup_logging

    setup_logging(args.log_level)
    from pipelines.failures import debug_requested

    debug = args.debug or debug_requested()
    # The one place where a command's failure becomes one line and a non-zero exit, not a traceback:
    # a bad configuration, a missing or unreadable input or a full disk (exit 2), a failed job it
    # started or anything else (exit 1). --debug (or RLAX_DEBUG=1) shows the traceback first.
    try:
        bare = _bare_words(beam_args)
        if bare:
            raise ConfigError("", f"{bare[0]!r} is neither a flag nor an override; overrides are dotted "
                                  f"key=value words, e.g. {OVERRIDE_EXAMPLE}")
        return int(args._module.run(args, beam_args) or 0)
    except KeyboardInterrupt:
        print(f"rlax {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:
        from pipelines.failures import JobFailed
        from rlax_core.utils.resources import LINE_MARK, resource_failure

        if debug:
            import traceback

            traceback.print_exc()
        resource = resource_failure(error, f"rlax {args.command}")
        if resource is not None:  # however deep a library wrapped it
            return _fail(args.command, LINE_MARK.rstrip(": "), resource)
        if isinstance(error, ConfigError):
            return _fail(args.command, "config error", error)
        if isinstance(error, (InputError, OSError)):  # OSError: a file missing, unreadable, not what it claims
            return _fail(args.command, "input error", error)
        if isinstance(error, JobFailed):  # says which job, why (from its log) and where its log is
            return _fail(args.command, "error", error, code=1)
        hint = "" if debug else " (--debug shows the traceback)"
        return _fail(args.command, "error", f"{type(error).__name__}: {_clip(str(error))}{hint}", code=1)


def _fail(command: str, kind: str, error: Exception | str, code: int = 2) -> int:
    import logging

    logging.getLogger(__name__).debug("%s", kind, exc_info=True)
    message = " ".join(str(error).split()) or type(error).__name__
    print(f"rlax {command}: {kind}: {message}", file=sys.stderr)
    return code


def _clip(message: str, limit: int = 1000) -> str:
    """A message as one line, cut to ``limit`` characters: some libraries' errors hold whole specs."""
    text = " ".join(message.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


if __name__ == "__main__":
    sys.exit(main())
