"""``rlax launch`` of a recipe that names stages: each stage by its own job, in order, wired together.

    rlax launch --config RECIPE --output runs/warm              # curate -> rft -> sft -> filter -> rl -> evaluate
    rlax launch --config RECIPE --output runs/warm --dry-run    # the plan: each stage's command, inputs, outputs
    rlax launch --config RECIPE --output runs/warm --resume     # again: the finished stages are skipped

Every stage but ``rl`` is its command in its own process (``rlax curate``, ``rlax rft``, ``rlax rm``,
``rlax sft``, ``rlax filter``, ``rlax evaluate``: the same jobs, logs in ``OUTPUT/logs/STAGE.log``), on
the recipe with the command line's overrides, then the recipe's ``stage_overrides`` of that stage,
then the wiring below (last: the plan printed is what runs). ``rl`` is ``pipelines.launch.launch``,
the trainer and the rollout stream (Beam options on the command line go to its rollout job; the batch
stages take the recipe's ``beam:`` sections). The wiring (``OUTPUT``: ``run.output_dir``):

    curate    -> OUTPUT/curated        from the recipe's curate.inputs
    rft       -> OUTPUT/rft            the curated prompts sampled by rft.generator (default the policy):
                                       verified rows sft-*.parquet, pairs pairs-*.parquet
    rm        -> OUTPUT/rm/hf/step_N   on rm.data, else rft's pairs; rl's reward_model term reads it
    sft       -> OUTPUT/sft/hf/step_N  on sft.data, else rft's rows; this export is the policy from here on
    filter    -> OUTPUT/filtered       the curated prompts sampled by the policy
    rl        -> OUTPUT/rl             from the policy, on the filtered prompts (else the curated ones)
    evaluate  -> OUTPUT/eval           the base model, the SFT export and rl's final version side by side

A stage is done once its marker exists, and a rerun (``--resume``) skips it with a line saying so:
a batch job's ``_SUCCESS`` (``rlax_core.data.completion``), the rl stage's sealed checkpoint of its
last step (state and data ledger together: ``rlax_core.training.checkpoint``), sft's and rm's final
export (written after their last checkpoint). An unfinished stage runs again: a batch job rewrites
its folder, a trainer job resumes from its newest checkpoint. A stage whose input an earlier stage
did not leave is refused in one line, before it starts. A recipe that names no stages (or ``rl``
alone) is the plain launch. ``pipelines.launch.run_staged`` is the command's entry to this module.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Callable, Sequence

from rlax_core.config import InputError, require
from rlax_core.utils.paths import is_remote

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Stage:
    name: str
    argv: tuple[str, ...]  # the rlax command it runs (rl: empty, it is pipelines.launch.launch)
    overrides: tuple[str, ...]  # every override its job takes: the command line's, the stage's, the wiring
    inputs: tuple[tuple[str, str], ...]  # (what, path) it reads
    outputs: tuple[tuple[str, str], ...]  # (what, path) it leaves
    marker: str  # exists once the stage has finished
    after: tuple[tuple[str, str], ...] = ()  # (stage, marker) of the earlier stages whose outputs it reads
    train_set: str = ""  # rl: the prompts
    prompts: int | None = None  # what a sampling stage samples at most (its progress lines)


def staged(stages: Sequence[str]) -> bool:
    """Whether ``rlax launch`` runs a plan of stages (not the trainer and the rollout stream alone)."""
    return tuple(stages) not in ((), ("rl",))


def output_root(run_config) -> str:
    output = run_config.run.output_dir.rstrip("/")
    return output if is_remote(output) else str(Path(output).expanduser().resolve())


def plan(config: str, overrides: Sequence[str]) -> list[Stage]:
    """The recipe's stages with their inputs and outputs, each stage's config loaded (so a bad stage
    override or a stage without what it needs is refused here, in one line, before anything runs)."""
    from pipelines.config import load_run_config
    from rlax_core.data.completion import SUCCESS  # a batch job's folder is complete
    from rlax_core.models.export import MODEL_CONFIG  # written last into an export (training.job.is_exported)
    from rlax_core.training.checkpoint_integrity import SEAL_NAME  # written last into a checkpoint

    run_config = load_run_config(config, overrides)
    require(run_config.model.upcycle is None, "model.upcycle", "a staged run starts every stage from one policy "
            "folder; upcycle the model first (rlax upcycle) and name it as model.path")
    root = output_root(run_config)
    user = [*(o for o in overrides if not o.startswith("run.output_dir=")), f"run.output_dir={root}"]
    base = run_config.model.resolved_path()
    policy, reward_model = base, ""  # what the next stage samples and trains; rm's model
    made: dict[str, str] = {}  # stage -> its marker
    evaluated = [("base", base)]
    result = []

    def stage(name: str, wiring: list[str], inputs, outputs, marker: str, reads: Sequence[str], **extra) -> None:
        every = (*user, *run_config.stage_overrides.get(name, ()), *wiring)
        argv = () if name == "rl" else (name, "--config", config, *every)
        after = tuple((before, made[before]) for before in reads if before in made)
        result.append(Stage(name, argv, every, tuple(inputs), tuple(outputs), marker, after, **extra))
        made[name] = marker

    def trainer_folder(name: str) -> list[str]:
        """A trainer stage's own run folder, metrics and weight store (an explicit ``weights.root``
        or ``run.metrics_dir`` is the rl stage's)."""
        wiring = [f"run.output_dir={root}/{name}"]
        if run_config.run.metrics_dir:
            wiring.append(f"run.metrics_dir={run_config.run.metrics_dir.rstrip('/')}/{name}")
        if run_config.weights is not None:
            wiring.append(f"weights.root={root}/{name}/weights")
        return wiring

    def stage_config(name: str, wiring: list[str]):
        return load_run_config(config, [*user, *run_config.stage_overrides.get(name, ()), *wiring])

    curated = f"{root}/curated/examples-*.parquet"
    for name in run_config.stages:
        if name == "curate":
            wiring = [f"curate.output={root}/curated"]
            section = stage_config(name, wiring).curate
            require(bool(section.inputs), "curate.inputs", "the curate stage has no input: list the raw datasets "
                    "under curate.inputs")
            stage(name, wiring, [("input", s.path) for s in section.inputs]
                  + [("eval set", s.path) for s in section.decontaminate_against],
                  [("examples", curated)], f"{root}/curated/{SUCCESS}", ())
        elif name == "rft":
            wiring = [f"rft.input={curated}", f"rft.output={root}/rft"]
            section = stage_config(name, wiring).rft
            generator = section.generator or policy
            if not section.generator:
                wiring.append(f"rft.generator={policy}")
            stage(name, wiring, [("prompts", curated), ("generator", generator)],
                  [("sft rows", f"{root}/rft/sft-*.parquet"), ("pairs", f"{root}/rft/pairs-*.parquet")],
                  f"{root}/rft/{SUCCESS}", ("curate",), prompts=section.limit or None)
        elif name in ("sft", "rm"):
            data = getattr(run_config, name).data
            if not data:
                require("rft" in made, "stages", f"{name} has no data: list rft before {name}, or set {name}.data")
                require(name == "sft" or run_config.rft.pairs_per_prompt > 0, "rft.pairs_per_prompt",
                        "the rm stage trains on rft's preference pairs: set it > 0, or set rm.data")
                data = f"{root}/rft/{'sft' if name == 'sft' else 'pairs'}-*.parquet"
            wiring = [f"{name}.data={data}", f"model.path={policy}", *trainer_folder(name)]
            steps = stage_config(name, wiring).trainer.total_steps
            export = f"{root}/{name}/hf/step_{steps:08d}"
            stage(name, wiring, [("data", data), ("model", policy)],
                  [("model" if name == "sft" else "reward model", export)], f"{export}/{MODEL_CONFIG}",
                  ("rft",) if not getattr(run_config, name).data else ())
            if name == "sft":
                policy = export
                evaluated.append(("sft", export))
            else:
                require("reward_model" in run_config.loop.rewards.terms or "rl" not in run_config.stages,
                        "loop.rewards.terms", "the rm stage trains the model the rl stage's reward_model term "
                        "reads, and the terms name none: add reward_model (its path is wired to the rm stage's)")
                reward_model = export
        elif name == "filter":
            wiring = [f"filter.input={curated}", f"filter.output={root}/filtered", f"filter.generation.model={policy}"]
            section = stage_config(name, wiring).filter
            stage(name, wiring, [("prompts", curated), ("model", policy)],
                  [("examples", f"{root}/filtered/examples-*.parquet")],
                  f"{root}/filtered/{SUCCESS}", ("curate", "sft"), prompts=section.limit or None)
        elif name == "rl":
            train_set = f"{root}/filtered/examples-*.parquet" if "filter" in made else curated
            wiring = [f"run.output_dir={root}/rl", f"model.path={policy}"]
            if reward_model:
                wiring.append(f"loop.rewards.reward_model.path={reward_model}")
            rl = stage_config(name, wiring)
            final = f"weights:{rl.weight_store().root}"
            evaluated.append(("rl", final))
            stage(name, wiring, [("prompts", train_set), ("model", policy)]
                  + ([("reward model", reward_model)] if reward_model else []),
                  [("final version", final), ("checkpoints", f"{root}/rl/checkpoints"),
                   ("metrics", rl.loop_metrics_dir())],
                  f"{root}/rl/checkpoints/{rl.trainer.total_steps}/{SEAL_NAME}", ("curate", "filter", "sft", "rm"),
                  train_set=train_set)
        elif name == "evaluate":
            wiring = [f"evaluate.models={json.dumps([path for _, path in evaluated])}",
                      f"evaluate.model_names={json.dumps([label for label, _ in evaluated])}",
                      f"evaluate.output={root}/eval"]
            section = stage_config(name, wiring).evaluate
            require(bool(section.eval_sets), "evaluate.eval_sets", "the evaluate stage has no evaluation set: list "
                    "them under evaluate.eval_sets")
            stage(name, wiring, [(f"model {label}", path) for label, path in evaluated]
                  + [("eval set", s.path) for s in section.eval_sets],
                  [("report", f"{root}/eval/report.md")], f"{root}/eval/{SUCCESS}", ("sft", "rl"))
    return result


def exists(path: str) -> bool:
    """Whether a marker exists, creating nothing (a local ``Storage`` makes its folder)."""
    if not is_remote(path):
        return Path(path.removeprefix("file://")).exists()
    import fsspec

    return fsspec.core.url_to_fs(path)[0].exists(path)


def is_done(stage: Stage) -> bool:
    return exists(stage.marker)


def require_earlier(stage: Stage) -> None:
    """Refuse (one line) a stage whose input an earlier stage has not finished writing."""
    for before, marker in stage.after:
        if not exists(marker):
            raise InputError(f"the {stage.name} stage reads what the {before} stage leaves, and that stage has not "
                             f"finished ({marker} is missing): run the {before} stage first")


def describe(stages: Sequence[Stage], config: str) -> list[str]:
    """The plan, as ``--dry-run`` prints it: each stage's command, inputs, outputs and whether it is done."""
    import shlex

    lines = [f"rlax launch: {len(stages)} stages of {config}: {' -> '.join(s.name for s in stages)}"]
    for number, stage in enumerate(stages, 1):
        state = "  (done: skipped)" if is_done(stage) else ""
        command = ("rlax " + shlex.join(stage.argv) if stage.argv else
                   "the trainer and the rollout stream (rlax launch), with " + shlex.join(stage.overrides))
        lines += [f"{number}. {stage.name}{state}", f"     runs    {command}"]
        lines += [f"     reads   {what}: {path}" for what, path in stage.inputs]
        lines += [f"     writes  {what}: {path}" for what, path in stage.outputs]
        lines.append(f"     done    when {stage.marker} exists")
    return lines


def run_stages(stages: Sequence[Stage], config: str, log_folder: Path, *, run_loop: Callable[..., dict],
               beam_args: Sequence[str] = (), timeout_s: float = 3600.0, **loop_options) -> dict[str, float]:
    """Run the stages in order, skipping those done; returns each run stage's seconds.

    ``run_loop`` is ``pipelines.launch.launch`` (the rl stage); the other stages are their commands.
    """
    from pipelines.lifeline import run_step

    seconds = {}
    log_folder.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        if is_done(stage):
            log.info("launch: stage %s is done (%s); skipped", stage.name, stage.marker)
            print(f"rlax launch: stage {stage.name} already done ({stage.marker}); skipped", flush=True)
            continue
        require_earlier(stage)
        log.info("launch: stage %s", stage.name)
        started = time.monotonic()
        if stage.name == "rl":
            # resume: a partly trained rl stage continues; on a new run its folder is new (the run's was claimed empty)
            run_loop(config, list(stage.overrides), list(beam_args), train_set=stage.train_set, timeout_s=timeout_s,
                     resume=True, **loop_options)
        else:
            run_step(list(stage.argv), log_folder / f"{stage.name}.log", timeout_s=timeout_s, prompts=stage.prompts,
                     who="launch")
        if not is_done(stage):  # a job that exits 0 without its marker: said, not passed on to the next stage
            raise InputError(f"the {stage.name} stage finished without {stage.marker}; its log: "
                             f"{log_folder / (stage.name + '.log')}")
        seconds[stage.name] = round(time.monotonic() - started, 1)
        print(f"rlax launch: stage {stage.name} done in {seconds[stage.name]:.0f} s", flush=True)
    return seconds
