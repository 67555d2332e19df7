"""One skeleton for the Beam batch commands (``rlax curate``, ``rlax filter``, ``rlax evaluate``).

Each command module gives its parts; :meth:`BatchCommand.run` puts them in the same order for all:

1. ``resolve(args)``: the config file, dotted overrides and flags -> the command's config section
   and the config's Beam options (``ConfigError`` on a bad value);
2. Beam options: the config's and the command line's (``pipelines.runners.pipeline_options``);
   ``--dry_run`` translates the job for Dataflow against its paths and submits nothing
   (``pipelines.dataflow_job``): offline, it reads no input and lists them as not checked;
3. ``inputs(config)``: ``(what, path)`` of every input, each resolved before anything heavy
   (``pipelines.inputs``: ``"model"`` a checkpoint or version, anything else a dataset);
4. ``build(pipeline, config)``: the job, run to its end (a full disk named with the output's path:
   ``rlax_core.utils.resources``);
5. ``finish(config, seconds, allow_empty)``: read what the job wrote, refuse a job that wrote nothing
   from a non-empty input unless ``--allow-empty``, print it; returns the exit code.

The output folder says whether it is complete (``rlax_core.data.completion``): ``_INCOMPLETE`` is
written before the job starts (what a previous run left there, Beam temp folders and files named as
the command names its own, ``writes``, is removed), ``_SUCCESS`` last, once step 5 returned 0.
Every command that reads a folder refuses one that is not complete, naming the command to run again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import shlex
import time
from typing import Any, Callable

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BatchCommand:
    name: str
    resolve: Callable[[argparse.Namespace], tuple[Any, list[str]]]
    inputs: Callable[[Any], list[tuple[str, str]]]
    build: Callable[[Any, Any], None]
    finish: Callable[[Any, float, bool], int]
    writes: tuple[str, ...]  # name patterns of the files the job writes in its output folder

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        """The flags every batch command takes."""
        parser.add_argument("--allow-empty", action="store_true",
                            help="succeed even when the job writes no row (by default an empty result fails)")

    def run(self, args: argparse.Namespace, beam_args: list[str]) -> int:
        """The command line's entry point: steps 1 to 5."""
        config, config_beam_args = self.resolve(args)
        return self.execute(config, config_beam_args, beam_args, allow_empty=args.allow_empty,
                            rerun="rlax " + shlex.join(args.argv))

    def execute(self, config: Any, config_beam_args: list[str], beam_args: list[str] = (), *,
                allow_empty: bool = False, rerun: str | None = None) -> int:
        """Steps 2 to 5 for a config already resolved (``rlax launch --rehearse`` runs the stages so);
        ``rerun``: the command line that runs it again (the output folder records it)."""
        import apache_beam as beam

        from rlax_core.config import to_dict
        from rlax_core.data.completion import begin_output, complete_output
        from rlax_core.utils.resources import ResourceError, resource_failure
        from pipelines.dataflow_job import is_dry_run, print_dry_run
        from pipelines.inputs import require_dataset, require_model
        from pipelines.runners import pipeline_options

        options = pipeline_options(config_beam_args, beam_args)
        inputs = self.inputs(config)
        if is_dry_run(options):  # translate for Dataflow against the paths, offline: read nothing, submit nothing
            return print_dry_run(self.name, options, lambda pipeline: self.build(pipeline, config),
                                 [f"{what} {path}" for what, path in inputs])
        for what, path in inputs:
            require_model(path) if what == "model" else require_dataset(path, what, rewriting=config.output)
        log.info("%s config: %s", self.name, json.dumps(to_dict(config)))
        command = f"rlax {self.name}"
        rerun = rerun or f"{command} with the same arguments"
        begin_output(config.output, command, rerun, self.writes)
        started = time.perf_counter()
        try:
            with beam.Pipeline(options=options) as pipeline:
                self.build(pipeline, config)
        except Exception as error:
            # A runner passes a worker's full disk on as text without the path: name the output's.
            line = resource_failure(error, f"rlax {self.name}", where=[config.output])
            if line is None:
                raise
            raise ResourceError(line) from error
        seconds = time.perf_counter() - started
        code = self.finish(config, seconds, allow_empty)
        if code == 0:
            complete_output(config.output, command, rerun, seconds)
        return code
