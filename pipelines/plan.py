"""``rlax plan``: a run's memory per chip (rollout engine and trainer) against its declared hardware.

    rlax plan --config configs/qwen25_7b_math_dataflow_tpu.yaml
    rlax plan --recipes --markdown          # the table of docs/memory.md, every recipe in configs/
    rlax plan --chips 1024 --compiled runs/compile-qwq32b-v5p-bf16.json --trainer-step-s 400
                                            # the rollout/trainer split that trains the most tokens (docs/fleet.md)

Reads ``model.path`` (the checkpoint's shape only: ``rlax_core.models.checkpoint.read_model_config``),
``model.dtype``, ``engine``, ``trainer``, ``algorithm``, ``loop.sampling.samples_per_prompt``, the engines of
``filter.generation`` and ``evaluate.generation`` (on ``hardware.filter`` / ``hardware.evaluate``, by default the
rollout workers) and ``hardware``
(``rlax_core.planning.hardware``). Exits 1 with the numbers and the keys to turn when
a role does not fit. ``rlax rollout``, ``rlax train`` and ``rlax launch`` make the same check when
they load their config (:func:`check_memory`), before anything starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from pathlib import Path

from pipelines.config import template_of
from rlax_core.planning.memory import MemoryPlan, gib, plan_rollout, plan_trainer, refuse_unless_fits

HELP = "memory per chip of the rollout engine and the trainer against the config's declared hardware"
ROLES = ("rollout", "trainer", "filter", "evaluate", "rft", "reward_model")
POST_TRAINING_ROLES = ("sft", "dpo", "rm")  # the trainer with another objective: rlax plan --post-training

log = logging.getLogger(__name__)


def memory_plans(config, roles=ROLES) -> list[MemoryPlan]:
    """The plans of a ``pipelines.config.RunConfig``'s roles; none when it declares no hardware."""
    from rlax_core.models.checkpoint import read_model_config
    from pipelines.config import resolve_asset
    from pipelines.config import policy_shape, scoring_models_beside

    if config.hardware is None:
        log.warning("no hardware: section in the config; its memory is not planned")
        return []
    name = _name_of(config.model.path)
    plans = []
    hardware = config.hardware
    if hardware.rollout is not None or hardware.trainer is not None:
        model = policy_shape(config)
    if "rollout" in roles and hardware.rollout is not None:
        # A LoRA run's versions after the base are adapters, which the rollout engine applies itself.
        plans.append(plan_rollout(model, config.engine, hardware.rollout, config.model.dtype, name,
                                  lora=config.trainer.lora, beside=scoring_models_beside(config)))
    if "reward_model" in roles:
        plans.extend(reward_stage_plan(config))
    # Difficulty filtering and evaluation run an engine on their workers (by default the rollouts' kind).
    generations = [("filter", config.filter.generation, config.filter.generation.model)]
    generations += [("evaluate", config.evaluate.generation, path) for path in config.evaluate.models]
    if config.rft.input:  # a run that makes rejection-sampling data: its generator, on the filter's workers
        generations.append(("rft", config.rft.generation, config.rft.generator or config.policy_path()))
    for role, generation, path in generations:
        workers = hardware.workers_of("filter" if role == "rft" else role)
        if role in roles and path and workers is not None:
            shape = read_model_config(template_of(resolve_asset(path)))
            plans.append(dataclasses.replace(
                plan_rollout(shape, generation.engine, workers, generation.dtype, _name_of(path)), role=role))
    if "trainer" in roles and hardware.trainer is not None:
        plans.append(plan_trainer(model, config.trainer, hardware.trainer,
                                  rows_per_step=config.rows_per_step(),
                                  uses_reference=config.algorithm.uses_reference,
                                  uses_value_model=config.algorithm.uses_values, name=name))
    # rlax sft and rlax dpo: the same trainer on the trainer's chips; DPO's batch holds both samples of
    # each pair, and a frozen reference unless its log-probs were computed before the run.
    post = {"sft": (config.sft.examples_per_step, False),
            "dpo": (2 * config.dpo.pairs_per_step, config.dpo.reference == "step"),
            "rm": (2 * config.rm.pairs_per_step, False)}
    for role, (rows, reference) in post.items():
        if role in roles and hardware.trainer is not None:
            plans.append(dataclasses.replace(plan_trainer(model, config.trainer, hardware.trainer, rows_per_step=rows,
                                                          uses_reference=reference, name=name), role=role))
    return plans


def reward_stage_plan(config) -> list[MemoryPlan]:
    """The scoring's models on a stage of their own (``placement: own_stage``: a reward model, a
    distillation teacher), each whole on one chip of ``hardware.reward_model`` (by default the rollout
    fleet's kind): their weights and one forward each."""
    from pipelines.config import scoring_models
    from rlax_core.planning.memory import scoring_model_parts

    models, chips = scoring_models(config, "own_stage"), config.hardware.workers_of("reward_model")
    if not models or chips is None:
        return []
    parts, knobs = {}, {}
    for name, shape, settings in models:
        parts.update(scoring_model_parts(shape, settings.batch_size, settings.max_length, settings.dtype, name))
        section = "reward_model" if name == "reward model" else "distillation"
        knobs.update({f"{name} weights": f"loop.rewards.{section}.dtype",
                      f"{name} activations": f"loop.rewards.{section}.batch_size or max_length"})
    label = " + ".join(_name_of(settings.path if name == "reward model" else settings.teacher)
                       for name, _, settings in models)
    return [MemoryPlan("reward_model", label, chips.chip, 1, "whole on one chip", chips.bytes_per_chip, parts, knobs)]


def layout_warnings(config) -> list[str]:
    """What the plan's bytes cannot show but the compiled programs will pay: a mixture of experts whose
    experts split into partial 128-lane tiles on a TPU role (``rlax_core.planning.tiles``)."""
    from pipelines.config import policy_shape
    from rlax_core.parallel.mesh import mesh_shape
    from rlax_core.planning.tiles import expert_tile_warning

    hardware = config.hardware
    if hardware is None or (hardware.rollout is None and hardware.trainer is None):
        return []
    model = policy_shape(config)
    found = []
    if hardware.rollout is not None:
        found.append(expert_tile_warning(model, "rollout", hardware.rollout.chip, config.engine.tensor_parallel,
                                         "engine.tensor_parallel"))
    if hardware.trainer is not None:
        tensor = mesh_shape(config.trainer.mesh, hardware.trainer.chips)[-1]
        found.append(expert_tile_warning(model, "trainer", hardware.trainer.chip, tensor, "trainer.mesh.tensor"))
    return [warning for warning in found if warning]


def pool_occupancy(config, plan: MemoryPlan) -> str:
    """The rollout pool's pages and tokens and the sequences that decode at once at the recipe's mean
    and maximum response lengths (``loop.response_lengths``), under each admission."""
    from rlax_core.planning.memory import concurrent_sequences, mean_occupancy

    engine, budget = config.engine, config.loop.sampling.budget(config.engine)
    lengths = config.loop.response_lengths.sample(budget)
    prompt = min(engine.prefill_buckets)  # a prompt is taken to fill the smallest bucket (as the fleet does)
    mean = sum(lengths) / len(lengths)
    fit = {admission: concurrent_sequences(plan.num_pages, plan.page_size, engine.num_slots, prompt, max(lengths),
                                           mean_occupancy(lengths), admission) for admission in ("on_demand", "reserve")}
    return (f"rollout KV pool {plan.num_pages:,} pages x {plan.page_size} = {plan.num_pages * plan.page_size:,} "
            f"tokens per replica; responses of mean {mean:,.0f} (cap {max(lengths):,}), prompts of {prompt}: "
            f"{fit['on_demand']} of {engine.num_slots} slots decode at once with pages on demand "
            f"(engine.admission={engine.admission}), {fit['reserve']} reserving whole budgets, "
            f"{fit['reserve']} when every response runs to the cap")


def mismatch_warning(config) -> str | None:
    """A line when the rollout engine is eight-bit and the algorithm corrects no mismatch."""
    engine, algorithm = config.engine, config.algorithm
    if not engine.eight_bit or algorithm.mismatch_correction != "none":
        return None
    return (f"engine.weight_dtype={engine.weight_dtype}, cache_dtype={engine.cache_dtype}: an eight-bit engine "
            "without a mismatch correction (algorithm.mismatch_correction: none); set it to tis "
            "(token level, mismatch_high 2), as a run that leaves it unset gets")


def _name_of(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1].removeprefix("assets:")


def check_memory(config, roles=ROLES) -> None:
    """Refuse (``ConfigError``: the numbers and the knobs) a config whose roles do not fit their chips."""
    refuse_unless_fits(memory_plans(config, roles))
    for warning in layout_warnings(config):
        log.warning(warning)


def recipe_paths() -> list[Path]:
    """The recipes in configs/ that declare hardware or hold an engine or a trainer section, but
    base.yaml (the defaults every recipe starts from, not a run of its own)."""
    from pipelines.config import CONFIG_DIR
    from rlax_core.config import read_yaml

    return [path for path in sorted(CONFIG_DIR.glob("*.yaml"))
            if path.name != "base.yaml" and {"engine", "trainer", "hardware"} & set(read_yaml(path))]


def markdown_table(rows: list[tuple[str, MemoryPlan]]) -> str:
    lines = ["| recipe | role | model | chips | layout | per chip | total / usable | headroom |",
             "|---|---|---|---|---|---|---|---|"]
    for recipe, plan in rows:
        parts = ", ".join(f"{kind} {gib(size)}" for kind, size in plan.parts.items())
        lines.append(f"| {recipe} | {plan.role} | {plan.model} | {plan.chips} x {plan.chip} | {plan.layout} | {parts} | "
                     f"{gib(plan.total)} / {gib(plan.usable)} | {gib(plan.headroom)} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipes", action="store_true", help="plan every run recipe in configs/ (not --config)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (docs/memory.md)")
    parser.add_argument("--post-training", action="store_true", help="also plan the rlax sft, rlax dpo and rlax rm trainers")
    parser.add_argument("--chips", type=int, help="propose the split of this many chips between rollout and trainer "
                        "that trains the most tokens per second (needs --compiled)")
    parser.add_argument("--compiled", nargs="+", metavar="REPORT", help="with --chips: the recipe's `rlax compile "
                        "--json` reports (the first names the recipe, as benchmarks/fleet_sim.py --compiled takes them)")
    parser.add_argument("--trainer-step-s", type=float, help="with --chips: the trainer's seconds per step at the "
                        "recipe's trainer chips instead of the compiled update's (assumed)")


def plan_split(args: argparse.Namespace) -> int:
    """``rlax plan --chips N --compiled REPORT...``: the split that trains the most tokens per second."""
    from pipelines.fleet import best_split, split_table
    from rlax_core.config import ConfigError

    if not args.compiled:
        raise ConfigError("compiled", "rlax plan --chips needs the recipe's compile reports: --compiled REPORT ...")
    try:
        sweep = best_split(args.compiled, args.chips, args.trainer_step_s)
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError("compiled", str(error)) from error
    best = sweep["best"]
    print(split_table(sweep))
    print(f"{sweep['config']}: of {args.chips:,} chips, {best['trainer_chips']:,} for the trainer and "
          f"{best['rollout_chips']:,} for {best['rollout_workers']} rollout workers train the most tokens: "
          f"{best['tokens_trained_per_s']:,.0f} per second ({best['seconds_per_step']:,.3g} s a step; the trainer's "
          f"step scaled from {sweep['trainer_step_s']['value']:,.3g} s at {sweep['trainer_step_s']['at_chips']:,} chips, "
          f"{sweep['trainer_step_s']['scaling']})")
    return 0


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from rlax_core.config import ConfigError
    from pipelines.config import load_run_config

    if beam_args:
        raise ConfigError("", f"rlax plan takes no Beam options; unknown arguments: {' '.join(beam_args)}")
    if args.recipes and args.config:
        raise ConfigError("", "rlax plan: give --config or --recipes, not both")
    if args.chips is not None:
        return plan_split(args)
    sources = recipe_paths() if args.recipes else [args.config]
    configs = {source: load_run_config(source, args.overrides) for source in sources}
    rows = [(Path(source).name if source else "(defaults)", plan) for source in sources
            for plan in memory_plans(configs[source], ROLES + (POST_TRAINING_ROLES if args.post_training else ()))]
    print(markdown_table(rows) if args.markdown else "\n".join(f"{name}: {plan.describe()}" for name, plan in rows))
    if not args.markdown:
        for source, config in configs.items():
            for plan in memory_plans(config, roles=("rollout",)):
                print(f"{Path(source).name if source else '(defaults)'}: {pool_occupancy(config, plan)}")
    for source, config in configs.items():
        for warning in [*layout_warnings(config), *filter(None, [mismatch_warning(config)])]:
            print(f"{Path(source).name if source else '(defaults)'}: warning: {warning}", file=sys.stderr)
    failing = [(name, plan) for name, plan in rows if not plan.fits]
    for name, plan in failing:
        print(f"{name}: {plan.role} does not fit; turn: {plan.advice()}", file=sys.stderr)
    return 1 if failing else 0
