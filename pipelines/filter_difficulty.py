"""``rlax filter``: keep the prompts a model solves sometimes but not always.

    rlax filter --input curated/examples-*.parquet --model pipelines/assets/stories260K \\
        --samples 8 --low 0.1 --high 0.9 --output filtered/

Each prompt is sampled ``samples`` times by the RLAX engine inside RunInference, every sample is
verified (math answers by the math verifier, other tasks by their reward's pass test), and the
prompt's pass rate decides: kept when ``low <= pass rate <= high``. Writes
``DIR/examples-*.parquet`` (kept rows with ``pass_rate``, ``n_samples``, ``filter_model_version``),
``DIR/rejected-*.jsonl`` (too easy, too hard, skipped, unreadable, with reasons),
``DIR/pass_rate_histogram.png`` and ``DIR/stats.json``. A run that keeps no prompt fails with the
rejections' counts unless ``--allow-empty``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter

import apache_beam as beam

from rlax_core.data.curation import InputSpec
from rlax_core.eval.report import pass_rate_histogram
from pipelines.batch import BatchCommand
from pipelines.inputs import require_rows
from pipelines.sections import FilterConfig
from transforms.difficulty import KeepPassRateBand, pass_rates_of
from transforms.examples import ToExamples
from transforms.inference import SampleAndVerify
from transforms.io import (ReadRawRecords, TakeSmallestIds, WriteNamedFiles, WriteExamples, WriteJsonFile,
                           WriteJsonLines, read_json)

HELP = "Beam batch: keep prompts whose pass rate lies in a band"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", help="Example rows: parquet or jsonl (glob; local or gs://)")
    parser.add_argument("--model", help="checkpoint: Hugging Face folder or llama2.c .bin (local or gs://)")
    parser.add_argument("--samples", type=int, help="samples per prompt (k)")
    parser.add_argument("--low", type=float, help="lowest pass rate kept")
    parser.add_argument("--high", type=float, help="highest pass rate kept")
    parser.add_argument("--limit", type=int, help="only the first N prompts by id")
    parser.add_argument("--output", help="output folder (local or gs://)")
    BatchCommand.add_arguments(parser)


def resolve_config(args: argparse.Namespace) -> tuple[FilterConfig, list[str]]:
    """The ``filter:`` section of the run config with the command-line flags on top; and the config's Beam options."""
    from pipelines.config import load_section, require_given, resolve_asset

    run_config = load_section(args.config, args.overrides, "filter")
    config = run_config.filter
    top = {k: v for k, v in (("input", args.input), ("output", args.output), ("low", args.low),
                             ("high", args.high), ("limit", args.limit)) if v is not None}
    generation = {"model": args.model} if args.model is not None else {}
    if args.samples is not None:
        generation["sampling"] = dataclasses.replace(config.generation.sampling, samples_per_prompt=args.samples)
    if generation:
        top["generation"] = dataclasses.replace(config.generation, **generation)
    config = dataclasses.replace(config, **top)
    require_given(config, {"input": "--input", "output": "--output", "generation.model": "--model"})
    # assets:NAME is the model shipped in the package: the recipe runs from any folder
    config = dataclasses.replace(config, generation=dataclasses.replace(
        config.generation, model=resolve_asset(config.generation.model)))
    if run_config.hardware is not None:  # a recipe that declares its workers: the engine must fit them
        from pipelines.plan import check_memory

        check_memory(dataclasses.replace(run_config, **{"filter": config}), roles=("filter",))
    return config, run_config.beam.args("filter")


def build(pipeline: beam.Pipeline, config: FilterConfig) -> None:
    out = config.output.rstrip("/")
    version = config.model_version or config.generation.label
    examples, unreadable = (pipeline | "Read" >> ReadRawRecords(config.input)
                            | "ToExamples" >> ToExamples(InputSpec(path=config.input, format=config.input_format), 1 << 20))
    results = (examples | "Limit" >> TakeSmallestIds(config.limit)
               | "SampleAndVerify" >> SampleAndVerify(config.generation, config.rewards, config.task_terms))
    kept, rejected = results | "KeepBand" >> KeepPassRateBand(config.low, config.high, version)
    all_rejected = (rejected, unreadable) | "AllRejected" >> beam.Flatten()
    kept | "WriteExamples" >> WriteExamples(f"{out}/examples")
    all_rejected | "WriteRejected" >> WriteJsonLines(f"{out}/rejected")

    rates = pass_rates_of(results)
    (rates | "AllRates" >> beam.combiners.ToList()
     | "Histogram" >> beam.Map(lambda r: ("pass_rate_histogram.png",
                                          pass_rate_histogram(r, (config.low, config.high), f"pass rates ({version})")))
     | "WriteHistogram" >> WriteNamedFiles(out))
    outcomes = ((kept | "KeptOutcome" >> beam.Map(lambda _: "kept"),
                 all_rejected | "RejectedOutcome" >> beam.Map(lambda row: row["reason"]))
                | "Outcomes" >> beam.Flatten() | "CountOutcomes" >> beam.combiners.Count.PerElement()
                | "OutcomeDict" >> beam.combiners.ToDict())
    (outcomes
     | "Stats" >> beam.Map(_stats, beam.pvalue.AsSingleton(rates | "AllRates2" >> beam.combiners.ToList()), config)
     | "WriteStats" >> WriteJsonFile(f"{out}/stats.json"))


def _stats(outcomes: dict, rates: list, config: FilterConfig) -> dict:
    counts = Counter(outcomes)
    return {"prompts": sum(counts.values()), "kept": counts["kept"], "too_easy": counts["too_easy"],
            "too_hard": counts["too_hard"], "skipped": counts["skipped"],
            "unreadable": sum(v for k, v in counts.items() if k not in ("kept", "too_easy", "too_hard", "skipped")),
            "band": [config.low, config.high], "samples_per_prompt": config.generation.sampling.samples_per_prompt,
            "mean_pass_rate": sum(rates) / len(rates) if rates else None,
            "model": config.generation.model, "model_version": config.model_version or config.generation.label}


def inputs(config: FilterConfig) -> list[tuple[str, str]]:
    return [("input", config.input), ("model", config.generation.model)]


def finish(config: FilterConfig, seconds: float, allow_empty: bool) -> int:
    stats = read_json(f"{config.output.rstrip('/')}/stats.json")
    print(json.dumps(stats, indent=2))
    print(f"rlax filter: kept {stats['kept']} of {stats['prompts']} prompts in {seconds:.1f} s; output {config.output}")
    outcomes = ", ".join(f"{stats[k]} {k.replace('_', ' ')}" for k in ("too_easy", "too_hard", "skipped", "unreadable")
                         if stats[k])
    require_rows("filter", stats["kept"], stats["prompts"], what="prompt", allow_empty=allow_empty,
                 see=f"{outcomes}; see {config.output.rstrip('/')}/rejected-*.jsonl" if outcomes else config.input)
    return 0


COMMAND = BatchCommand("filter", resolve_config, inputs, build, finish,
                       writes=("examples-*-of-*.parquet", "rejected-*-of-*.jsonl", "stats.json", "pass_rate_histogram.png"))


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    return COMMAND.run(args, beam_args)
