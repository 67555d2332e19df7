"""``rlax rft``: rejection-sampling fine-tuning data (and preference pairs) from verified samples.

    rlax rft --input prompts.jsonl --generator pipelines/assets/stories260K --samples 8 \\
        --max-per-prompt 2 --selection shortest --pairs-per-prompt 2 --output rft/

The difficulty filter's job (each prompt sampled ``samples`` times by the engine inside RunInference,
every sample verified by its task's reward), but the verified samples are kept instead of a pass-rate
band (``rlax_core.data.rejection_sampling``): ``DIR/sft-*.parquet`` (``SFT_EXAMPLE_SCHEMA``: at most
``max_per_prompt`` distinct verified samples per prompt, ``shortest`` first or ``random``, with the
prompt's pass rate and the generator), ``DIR/pairs-*.parquet`` (``PREFERENCE_PAIR_SCHEMA``: a verified
sample against a failed one of the same prompt, ``pairs_per_prompt`` at most), ``DIR/rejected-*.jsonl``
(unsolved, skipped and unreadable prompts, each with its reason) and ``DIR/stats.json``. The generator
is the run's policy (``model.path``) unless ``rft.generator`` names another model: a teacher, whose
samples are distillation data. A run that keeps no row fails with the counts unless ``--allow-empty``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter

import apache_beam as beam

from rlax_core.data.curation import InputSpec
from rlax_core.data.rejection_sampling import SKIPPED, UNSOLVED, generator_name
from rlax_core.data.records import PREFERENCE_PAIR_SCHEMA, SFT_EXAMPLE_SCHEMA
from pipelines.batch import BatchCommand
from pipelines.inputs import require_rows
from pipelines.sections import RftConfig
from transforms.examples import ToExamples
from transforms.inference import SampleAndVerify
from transforms.io import ReadRawRecords, TakeSmallestIds, WriteExamples, WriteJsonFile, WriteJsonLines, read_json
from transforms.rejection_sampling import KeepVerifiedSamples

HELP = "Beam batch: keep verified samples as SFT data and preference pairs (rejection sampling, distillation)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", help="Example rows: parquet or jsonl (glob; local or gs://)")
    parser.add_argument("--generator", help="the model that writes the samples (default: the run's policy, model.path)")
    parser.add_argument("--samples", type=int, help="samples per prompt (k)")
    parser.add_argument("--max-per-prompt", type=int, help="SFT rows per prompt at most")
    parser.add_argument("--selection", help="shortest (shortest verified first) or random (seeded)")
    parser.add_argument("--pairs-per-prompt", type=int, help="preference pairs per prompt at most (0: none)")
    parser.add_argument("--limit", type=int, help="only the first N prompts by id")
    parser.add_argument("--output", help="output folder (local or gs://)")
    BatchCommand.add_arguments(parser)


def resolve_config(args: argparse.Namespace) -> tuple[RftConfig, list[str]]:
    """The ``rft:`` section with the flags on top, its generator named (by default the
    run's policy, resolved) and its label the name the rows record; and the config's Beam options."""
    from pipelines.config import load_section, require_given, resolve_asset

    run_config = load_section(args.config, args.overrides, "rft")
    config = run_config.rft
    flags = {"input": args.input, "output": args.output, "generator": args.generator, "limit": args.limit,
             "max_per_prompt": args.max_per_prompt, "selection": args.selection,
             "pairs_per_prompt": args.pairs_per_prompt}
    top = {key: value for key, value in flags.items() if value is not None}
    if args.samples is not None:
        top["generation"] = dataclasses.replace(config.generation, sampling=dataclasses.replace(
            config.generation.sampling, samples_per_prompt=args.samples))
    config = dataclasses.replace(config, **top)  # validated again: a bad flag is refused by its key
    require_given(config, {"input": "--input", "output": "--output"})
    # assets:NAME is the model shipped in the package: the recipe runs from any folder
    generator = resolve_asset(config.generator) if config.generator else run_config.policy_path()
    name = generator_name(generator, config.generation.name)
    config = dataclasses.replace(config, generator=generator,
                                 generation=dataclasses.replace(config.generation, name=name))
    if run_config.hardware is not None:  # a recipe that declares its workers: the generator's engine must fit them
        from pipelines.plan import check_memory

        check_memory(dataclasses.replace(run_config, rft=config), roles=("rft",))
    return config, run_config.beam.args("rft")


def build(pipeline: beam.Pipeline, config: RftConfig) -> None:
    out = config.output.rstrip("/")
    examples, unreadable = (pipeline | "Read" >> ReadRawRecords(config.input)
                            | "ToExamples" >> ToExamples(InputSpec(path=config.input, format=config.input_format), 1 << 20))
    results = (examples | "Limit" >> TakeSmallestIds(config.limit)
               | "SampleAndVerify" >> SampleAndVerify(config.generation_spec(), config.rewards, config.task_terms))
    sft, pairs, rejected, outcomes = results | "KeepVerified" >> KeepVerifiedSamples(
        config.sample_selection(), config.generation_spec().label)
    sft | "WriteSft" >> WriteExamples(f"{out}/sft", schema=SFT_EXAMPLE_SCHEMA)
    pairs | "WritePairs" >> WriteExamples(f"{out}/pairs", schema=PREFERENCE_PAIR_SCHEMA)
    all_rejected = (rejected, unreadable) | "AllRejected" >> beam.Flatten()
    all_rejected | "WriteRejected" >> WriteJsonLines(f"{out}/rejected")
    unread = unreadable | "UnreadableOutcome" >> beam.Map(lambda row: {"reason": row["reason"], "pass_rate": None,
                                                                         "sft": 0, "pairs": 0, "duplicates": 0})
    ((outcomes, unread) | "Outcomes" >> beam.Flatten() | "AllOutcomes" >> beam.combiners.ToList()
     | "Stats" >> beam.Map(rft_stats, config) | "WriteStats" >> WriteJsonFile(f"{out}/stats.json"))


def rft_stats(outcomes: list[dict], config: RftConfig) -> dict:
    reasons = Counter(o["reason"] for o in outcomes)
    rates = [o["pass_rate"] for o in outcomes if o["pass_rate"] is not None]
    selection = config.sample_selection()
    return {"prompts": len(outcomes), "prompts_with_data": reasons[None], "unsolved": reasons[UNSOLVED],
            "skipped": reasons[SKIPPED], "unreadable": sum(n for r, n in reasons.items() if r not in (None, UNSOLVED, SKIPPED)),
            "sft_examples": sum(o["sft"] for o in outcomes), "pairs": sum(o["pairs"] for o in outcomes),
            "duplicates": sum(o["duplicates"] for o in outcomes),
            "all_passed": sum(rate == 1.0 for rate in rates),  # prompts that can give no pair
            "mean_pass_rate": sum(rates) / len(rates) if rates else None,
            "samples_per_prompt": config.generation.sampling.samples_per_prompt,
            "generator": config.generation_spec().label, "generator_path": config.generator,
            **dataclasses.asdict(selection)}


def inputs(config: RftConfig) -> list[tuple[str, str]]:
    return [("input", config.input), ("model", config.generator)]


def finish(config: RftConfig, seconds: float, allow_empty: bool) -> int:
    out = config.output.rstrip("/")
    stats = read_json(f"{out}/stats.json")
    print(json.dumps(stats, indent=2))
    print(f"rlax rft: {stats['sft_examples']} SFT rows and {stats['pairs']} pairs from {stats['prompts_with_data']} "
          f"of {stats['prompts']} prompts in {seconds:.1f} s; output {config.output}")
    outcomes = ", ".join(f"{stats[k]} {k}" for k in ("unsolved", "skipped", "unreadable") if stats[k])
    require_rows("rft", stats["sft_examples"] + stats["pairs"], stats["prompts"], what="prompt", allow_empty=allow_empty,
                 see=f"{outcomes}; see {out}/rejected-*.jsonl" if outcomes else config.input)
    return 0


COMMAND = BatchCommand("rft", resolve_config, inputs, build, finish,
                       writes=("sft-*-of-*.parquet", "pairs-*-of-*.parquet", "rejected-*-of-*.jsonl", "stats.json"))


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    return COMMAND.run(args, beam_args)
