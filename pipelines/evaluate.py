"""``rlax evaluate``: pass@k, maj@k, mean@n and response lengths of one or more checkpoints.

    rlax evaluate --model runs/base --model runs/step_100 --eval-set gsm8k/test.jsonl \\
        --eval-set math500_test.jsonl --samples 8 --limit 200 --output eval/
    rlax evaluate --model runs/x/hf/step_00000100 --model weights:runs/x/weights@90 \\
        --model checkpoint:runs/x/checkpoints@80 --eval-set gsm8k/test.jsonl --output eval/

A model is a Hugging Face folder (or llama2.c ``.bin``), a weight-store version
(``weights:STORE[@VERSION]``) or an orbax checkpoint of ``rlax train`` (``checkpoint:DIR[@STEP]``);
a folder holding ``committed/`` or numbered orbax checkpoints is recognised without the prefix
(``rlax_core.policy.source``).

Each prompt of each evaluation set is sampled ``samples`` times per model (RunInference with the
RLAX engine), every sample verified; the report holds pass@k (unbiased estimator), maj@k, mean@n
and lengths per dataset, subject and level, with the models side by side. Writes
``DIR/report.json``, ``DIR/report.md``, ``DIR/pass_at_k.png``, ``DIR/lengths.png`` and the
per-prompt samples and verdicts in ``DIR/samples-*.jsonl``.
"""

from __future__ import annotations

import argparse
import dataclasses

import apache_beam as beam

from rlax_core.config import InputError, require
from rlax_core.data.curation import InputSpec, eval_set_name
from pipelines.batch import BatchCommand
from pipelines.sections import EvaluateConfig
from transforms.evaluation import BuildReport, per_prompt_result
from transforms.examples import ToExamples
from transforms.inference import SampleAndVerify
from transforms.io import (ReadRawRecords, TakeSmallestIds, WriteJsonFile, WriteJsonLines, WriteNamedFiles,
                           read_json)

HELP = "Beam batch: pass@k, maj@k and lengths of a checkpoint on eval sets"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=[],
                        help="model to evaluate (repeat to compare): a Hugging Face folder or llama2.c .bin, "
                             "weights:STORE[@VERSION] (a weight-store version; default the newest) or "
                             "checkpoint:DIR[@STEP] (an orbax checkpoint of rlax train; default the newest)")
    parser.add_argument("--eval-set", action="append", default=[], help="evaluation set (repeatable; layout detected)")
    parser.add_argument("--samples", type=int, help="samples per prompt (n)")
    parser.add_argument("--limit", type=int, help="prompts per evaluation set (first N by id)")
    parser.add_argument("--output", help="output folder (local or gs://)")
    BatchCommand.add_arguments(parser)


def resolve_config(args: argparse.Namespace) -> tuple[EvaluateConfig, list[str]]:
    """The ``evaluate:`` section of the run config with the command-line flags on top; and the config's Beam options."""
    from pipelines.config import load_section, require_given, resolve_asset, resolve_input

    run_config = load_section(args.config, args.overrides, "evaluate")
    config = run_config.evaluate
    changes = {}
    if args.model:
        changes["models"] = tuple(args.model)
    if args.eval_set:
        changes["eval_sets"] = tuple(InputSpec(path=p) for p in args.eval_set)
    if args.samples is not None:
        changes["generation"] = dataclasses.replace(config.generation, sampling=dataclasses.replace(
            config.generation.sampling, samples_per_prompt=args.samples))
    if args.limit is not None:
        changes["limit"] = args.limit
    if args.output:
        changes["output"] = args.output
    # assets:NAME is a model shipped in the package: the recipe runs from any folder
    changes["models"] = tuple(resolve_asset(model) for model in changes.get("models", config.models))
    changes["eval_sets"] = tuple(resolve_input(spec, "eval_sets") for spec in changes.get("eval_sets", config.eval_sets))
    config = dataclasses.replace(config, **changes)
    require(not config.model_names or len(config.model_names) == len(config.models), "model_names",
            f"one name per model ({len(config.models)}), or none")
    require(len(set(config.labels)) == len(config.labels), "model_names", "distinct labels for the models")
    require_given(config, {"models": "--model", "eval_sets": "--eval-set", "output": "--output"})
    if run_config.hardware is not None:  # a recipe that declares its workers: the engine must fit them
        from pipelines.plan import check_memory

        check_memory(dataclasses.replace(run_config, **{"evaluate": config}), roles=("evaluate",))
    return config, run_config.beam.args("evaluate")


def build(pipeline: beam.Pipeline, config: EvaluateConfig) -> None:
    out = config.output.rstrip("/")
    sets, rejected, counts = [], [], []
    for i, spec in enumerate(config.eval_sets):
        named = dataclasses.replace(spec, source=eval_set_name(spec))
        examples, dead = (pipeline | f"Read[{i}]" >> ReadRawRecords(spec.path)
                          | f"ToExamples[{i}]" >> ToExamples(named, 1 << 20))
        sets.append(examples | f"Limit[{i}]" >> TakeSmallestIds(config.limit))
        rejected.append(dead)
        # What each eval set gave, so that run() can refuse a set that gave nothing to evaluate.
        counts.append((examples | f"Kept[{i}]" >> beam.Map(lambda _, i=i: (i, "rows")),
                       dead | f"Why[{i}]" >> beam.Map(lambda row, i=i: (i, row["reason"])))
                      | f"Outcomes[{i}]" >> beam.Flatten())
    rejected | "AllRejected" >> beam.Flatten() | "WriteRejected" >> WriteJsonLines(f"{out}/rejected")
    (counts | "AllOutcomes" >> beam.Flatten() | "CountOutcomes" >> beam.combiners.Count.PerElement()
     | "OutcomeList" >> beam.combiners.ToList()
     | "InputStats" >> beam.Map(_input_stats, [spec.path for spec in config.eval_sets])
     | "WriteInputStats" >> WriteJsonFile(f"{out}/inputs.json"))
    examples = sets | "AllSets" >> beam.Flatten()
    results = []
    for path, label in zip(config.models, config.labels):
        spec = dataclasses.replace(config.generation, model=path, name=label)
        results.append(examples | f"SampleAndVerify[{label}]" >> SampleAndVerify(spec, config.rewards, config.task_terms))
    rows = (results | "AllModels" >> beam.Flatten()) | "PerPrompt" >> beam.Map(per_prompt_result)
    rows | "WriteSamples" >> WriteJsonLines(f"{out}/samples")
    rows | "Report" >> BuildReport(config.ks, config.title) | "WriteReport" >> WriteNamedFiles(out)


def _input_stats(outcomes: list, paths: list[str]) -> dict:
    """``{path: {"rows": usable rows, "rejected": {reason: count}}}`` for every eval set, empty ones included."""
    stats = {path: {"rows": 0, "rejected": {}} for path in paths}
    for (index, outcome), count in outcomes:
        entry = stats[paths[index]]
        if outcome == "rows":
            entry["rows"] = count
        else:
            entry["rejected"][outcome] = count
    return stats


def check_inputs_used(stats: dict, report: dict, out: str) -> None:
    """Refuse a run that evaluated nothing: an eval set without a usable row, or no result at all."""
    for path, entry in stats.items():
        if entry["rows"] == 0:
            reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(entry["rejected"].items()))
            raise InputError(f"eval set {path}: no usable rows ({reasons or 'the set is empty'}"
                             + (f"; rejected rows in {out}/rejected-*.jsonl)" if reasons else ")"))
    if not report["models"]:
        raise InputError(f"nothing was evaluated (every prompt was skipped; see {out}/samples-*.jsonl)")


def inputs(config: EvaluateConfig) -> list[tuple[str, str]]:
    return [("model", model) for model in config.models] + [("eval set", spec.path) for spec in config.eval_sets]


def finish(config: EvaluateConfig, seconds: float, allow_empty: bool) -> int:
    from apache_beam.io.filesystems import FileSystems

    out = config.output.rstrip("/")
    with FileSystems.open(f"{out}/report.md") as handle:
        print(handle.read().decode("utf-8"))
    report = read_json(f"{out}/report.json")
    inputs = read_json(f"{out}/inputs.json")
    if not allow_empty:
        check_inputs_used(inputs, report, out)
    rejected = sum(n for entry in inputs.values() for n in entry["rejected"].values())
    print(f"rlax evaluate: {len(report['models'])} model(s), {seconds:.1f} s; output {config.output}"
          + (f"; {rejected} row(s) rejected, see {out}/rejected-*.jsonl" if rejected else ""))
    return 0


COMMAND = BatchCommand("evaluate", resolve_config, inputs, build, finish,
                       writes=("rejected-*-of-*.jsonl", "samples-*-of-*.jsonl", "inputs.json", "report.json", "report.md",
                               "pass_at_k.png", "lengths.png"))


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    return COMMAND.run(args, beam_args)
