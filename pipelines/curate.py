"""``rlax curate``: raw datasets -> deduplicated, decontaminated Example parquet shards.

    rlax curate --input gsm8k/train.jsonl --format gsm8k --input math/ --format math \\
        --decontaminate-against gsm8k/test.jsonl --decontaminate-against math500_test.jsonl --output DIR

writes ``DIR/examples-*.parquet``, ``DIR/dead_letter-*.jsonl`` (each rejected row, its reason and
the raw record) and ``DIR/stats.json``, where input = kept + duplicate + near_duplicate +
contaminated + dead_lettered. A run that keeps no row (an empty, unreadable or wrong-layout input)
fails with the dead letters' reasons unless ``--allow-empty``. ``--config configs/curate_gsm8k_math.yaml`` gives the same settings
from YAML; flags given on the command line win. Beam's own flags (``--runner``,
``--direct_num_workers``, Dataflow options) pass through.
"""

from __future__ import annotations

import argparse
import dataclasses

import apache_beam as beam

from rlax_core.config import ConfigError
from rlax_core.data.formats import FORMATS
from rlax_core.data.curation import STAT_NAMES, CurateConfig, InputSpec, eval_set_name
from pipelines.batch import BatchCommand
from pipelines.inputs import require_rows
from transforms.decontaminate import DropContaminated, NgramIndex
from transforms.dedup import DropExactDuplicates, DropNearDuplicates
from transforms.examples import ToExamples
from transforms.stats import CurationStats
from transforms.io import ReadRawRecords, WriteExamples, WriteJsonFile, WriteJsonLines, read_json

HELP = "Beam batch: normalise, dedup and decontaminate raw datasets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", action="append", default=[], metavar="PATH",
                        help="raw dataset: .jsonl, .json, .csv, .parquet, a datasets folder or hf:NAME[:CONFIG]:SPLIT (repeatable; local or gs://)")
    parser.add_argument("--format", action="append", default=[], choices=FORMATS, metavar="NAME",
                        help=f"layout of the inputs, once for all or once per --input in order: {', '.join(FORMATS)}")
    parser.add_argument("--decontaminate-against", action="append", default=[], metavar="PATH",
                        help="evaluation set whose prompts must not leak into the output (repeatable; layout detected)")
    parser.add_argument("--output", help="output folder (local or gs://)")
    BatchCommand.add_arguments(parser)


def load_curate_config(path: str | None, overrides: list[str]) -> tuple[CurateConfig, list[str]]:
    """The ``curate:`` section of the run config (a curate-only file is that section) and its Beam options."""
    from pipelines.config import load_section

    run_config = load_section(path, overrides, "curate")
    return run_config.curate, run_config.beam.args("curate")


def resolve_config(args: argparse.Namespace) -> tuple[CurateConfig, list[str]]:
    """The config file and overrides, then the command-line flags on top; and the config's Beam options."""
    config, config_beam_args = load_curate_config(args.config, args.overrides)
    changes = {}
    if args.input:
        formats = args.format or ["auto"]
        if len(formats) not in (1, len(args.input)):
            raise ConfigError("--format", f"give it once or once per --input ({len(args.input)}), got {len(formats)}")
        formats = formats * len(args.input) if len(formats) == 1 else formats
        changes["inputs"] = tuple(InputSpec(path=p, format=f) for p, f in zip(args.input, formats))
    elif args.format:
        raise ConfigError("--format", "applies to --input paths; none was given")
    if args.decontaminate_against:
        changes["decontaminate_against"] = tuple(InputSpec(path=p) for p in args.decontaminate_against)
    if args.output:
        changes["output"] = args.output
    config = dataclasses.replace(config, **changes)
    from pipelines.config import resolve_input  # assets:sql_tiny/train.json is the shipped task, from any folder

    config = dataclasses.replace(config, inputs=tuple(resolve_input(s, "inputs") for s in config.inputs),
                                 decontaminate_against=tuple(resolve_input(s, "decontaminate_against")
                                                             for s in config.decontaminate_against))
    if not config.inputs:
        raise ConfigError("inputs", "no input: give --input PATH or inputs in --config")
    if not config.output:
        raise ConfigError("output", "no output folder: give --output DIR or output in --config")
    return config, config_beam_args


def output_path(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}"


def build(pipeline: beam.Pipeline, config: CurateConfig) -> None:
    """Wire the curation steps into ``pipeline``."""
    raws, examples, dead_letters = [], [], []
    for i, spec in enumerate(config.inputs):
        raw = pipeline | f"Read[{i}]" >> ReadRawRecords(spec.path)
        adapted, rejected = raw | f"ToExamples[{i}]" >> ToExamples(spec, config.max_record_bytes)
        raws.append(raw)
        examples.append(adapted)
        dead_letters.append(rejected)
    all_raw = raws | "AllRaw" >> beam.Flatten()
    rows = examples | "AllExamples" >> beam.Flatten()

    rows, duplicates = rows | "ExactDedup" >> DropExactDuplicates()
    rows, near_duplicates = rows | "NearDedup" >> DropNearDuplicates(
        config.near_duplicate_threshold, config.minhash_num_perm, config.shingle_size, config.minhash_seed)
    dead_letters += [duplicates, near_duplicates]

    if config.decontaminate_against:
        eval_rows = []
        for i, spec in enumerate(config.decontaminate_against):
            named = dataclasses.replace(spec, source=eval_set_name(spec))
            # An evaluation row that cannot be read cannot leak either: its dead letters are dropped.
            adapted, _ = (pipeline | f"ReadEval[{i}]" >> ReadRawRecords(spec.path)
                          | f"EvalExamples[{i}]" >> ToExamples(named, config.max_record_bytes, prompts_only=True))
            eval_rows.append(adapted)
        index = (eval_rows | "AllEval" >> beam.Flatten()) | "NgramIndex" >> NgramIndex(config.contamination_ngram)
        rows, contaminated = rows | "Decontaminate" >> DropContaminated(index, config.contamination_ngram)
        dead_letters.append(contaminated)

    all_dead = dead_letters | "AllDeadLetters" >> beam.Flatten()
    rows | "WriteExamples" >> WriteExamples(output_path(config.output, "examples"), config.num_shards)
    all_dead | "WriteDeadLetters" >> WriteJsonLines(output_path(config.output, "dead_letter"))
    (rows | "Stats" >> CurationStats(all_raw, all_dead)
     | "WriteStats" >> WriteJsonFile(output_path(config.output, "stats.json")))


def format_stats(stats: dict) -> str:
    """The counts as a Markdown table, one row per source and a total."""
    lines = ["| source | " + " | ".join(STAT_NAMES) + " |", "|---" * (len(STAT_NAMES) + 1) + "|"]
    for source, counts in sorted(stats["by_source"].items()):
        lines.append(f"| {source} | " + " | ".join(f"{counts[n]:,}" for n in STAT_NAMES) + " |")
    lines.append("| **all** | " + " | ".join(f"**{stats[n]:,}**" for n in STAT_NAMES) + " |")
    return "\n".join(lines)


def inputs(config: CurateConfig) -> list[tuple[str, str]]:
    return [("input", spec.path) for spec in config.inputs] + [("eval set", s.path) for s in config.decontaminate_against]


def finish(config: CurateConfig, seconds: float, allow_empty: bool) -> int:
    stats = read_json(output_path(config.output, "stats.json"))
    print(format_stats(stats))
    print(f"input {stats['input']:,} rows; counts add up: {stats['consistent']}; "
          f"{seconds:.1f} s; output {config.output}")
    if stats["contaminated_by"]:
        print("contaminated by: " + ", ".join(f"{k} {v}" for k, v in sorted(stats["contaminated_by"].items())))
    reasons = ", ".join(f"{n:,} {reason}" for reason, n in sorted(stats["dead_letter_reasons"].items()))
    require_rows("curate", stats["kept"], stats["input"], what="example", allow_empty=allow_empty,
                 see=f"{reasons}; see {output_path(config.output, 'dead_letter-*.jsonl')}" if reasons
                 else ", ".join(spec.path for spec in config.inputs))
    return 0 if stats["consistent"] else 1


COMMAND = BatchCommand("curate", resolve_config, inputs, build, finish,
                       writes=("examples-*-of-*.parquet", "dead_letter-*-of-*.jsonl", "stats.json"))


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    return COMMAND.run(args, beam_args)
