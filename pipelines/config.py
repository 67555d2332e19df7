"""The configuration of a whole run: one tree, one YAML file, dotted overrides.

Each section is the dataclass of the package it configures, so its validation lives beside the code
that reads it; this module only assembles them::

    run:       name, seed, output folder
    model:     checkpoint path (HF folder, llama2.c .bin; local or gs://) and dtype; ``upcycle``: start
               from that model turned into a mixture of experts (``pipelines.initial_policy``)
    engine:    rlax_core.inference.EngineConfig     (rollout engine shapes)
    algorithm: rlax_core.rl.AlgorithmConfig         (``preset: grpo`` plus single-field overrides)
    trainer:   rlax_core.training.TrainerConfig     (optimizer, mesh, steps, staleness, checkpoints)
    weights:   rlax_core.weights.WeightStoreConfig  (parameter server; defaults under run.output_dir)
    curate:    rlax_core.data.curation.CurateConfig (Beam curation pipeline)
    filter:    pipelines.sections.FilterConfig      (difficulty filtering)
    evaluate:  pipelines.sections.EvaluateConfig    (offline evaluation)
    rft:       pipelines.sections.RftConfig         (rejection-sampling data: SFT rows and preference pairs)
    loop:      rlax_core.rollout.LoopConfig         (the streaming rollout side of the online loop)
    hardware:  rlax_core.planning.hardware.HardwareConfig  (chips of the rollout fleet and the trainer: ``rlax plan``)
    sft, dpo:  rlax_core.training.post_config        (``rlax sft``, ``rlax dpo``)
    stages:    the run's stages in order, ``stage_overrides`` per stage (pipelines.stages)
    beam:      runner and pipeline options (Dataflow project, region, workers, accelerators)

A file for one pipeline may spell only that pipeline's section (``configs/filter_stories260k.yaml``
holds FilterConfig's keys at top level); ``load_section`` reads such a file as that section of the
same tree, so every entry point validates against one schema.

``load_run_config("configs/quickstart.yaml", ["trainer.total_steps=5"])`` gives a validated
``RunConfig``; a bad key or value raises ``ConfigError`` naming its full path.
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence, Union

from rlax_core.config import ConfigError, apply_overrides, check_config_file, from_dict, read_yaml, require
from rlax_core.data.curation import CurateConfig
from rlax_core.inference.config import EngineConfig
from rlax_core.planning.hardware import HardwareConfig
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rl.presets import algorithm_from_dict, corrected_for_engine, get_preset
from rlax_core.rollout.config import LoopConfig
from rlax_core.training.config import TrainerConfig
from rlax_core.training.post_config import DpoConfig, RmConfig, SftConfig
from rlax_core.weights.config import WeightStoreConfig
from pipelines.beam_args import merge_beam_args
from pipelines.run_folder import UPCYCLED_MODEL
from pipelines.sections import EvaluateConfig, FilterConfig, RftConfig

PACKAGE_DIR = Path(__file__).resolve().parent
# The recipes are the repository's configs/; setup.py installs the same files as pipelines/configs,
# so an installed rlax finds them inside the package and a checkout finds them beside it.
CONFIG_DIR = next((folder for folder in (PACKAGE_DIR / "configs", PACKAGE_DIR.parent / "configs") if folder.is_dir()),
                  PACKAGE_DIR / "configs")
ASSETS_DIR = PACKAGE_DIR / "assets"


@dataclasses.dataclass(frozen=True)
class RunSpec:
    name: str = "rlax"
    seed: int = 0
    output_dir: str = "runs/rlax"  # local folder or gs://bucket/prefix
    metrics_dir: str = ""  # the trainer's and the loop's metrics; default: output_dir/metrics (and output_dir/loop)
    # JAX's persistent compilation cache (rlax_core.utils.compile_cache), shared by the run's processes
    # and by later runs: the folder ("" = $RLAX_COMPILATION_CACHE_DIR or ~/.cache/rlax/jax), or off.
    compilation_cache: bool = True
    compilation_cache_dir: str = ""

    def __post_init__(self):
        require(bool(self.name) and "/" not in self.name, "name", "a non-empty name without '/'")


@dataclasses.dataclass(frozen=True)
class UpcycleSpec:
    """Start the run from ``model.path`` (a dense Llama-family model) turned into a mixture of experts:
    each layer's MLP copied into ``num_experts`` experts, each with noise of ``noise`` times its
    kernel's std, and a small random router drawn from ``seed`` (``rlax_core.models.upcycle``). The
    mixture is written once into the run folder (``UPCYCLED_MODEL``) and is the run's policy from then
    on: the trainer and the engine load it like any checkpoint (``pipelines.initial_policy``)."""

    num_experts: int = 4
    experts_per_token: int = 2  # the router's top k
    noise: float = 0.01
    seed: int = 0

    def __post_init__(self):
        require(self.num_experts >= 2, "num_experts", f"a mixture needs >= 2 experts, got {self.num_experts}")
        require(1 <= self.experts_per_token <= self.num_experts, "experts_per_token",
                f"each token runs 1 to num_experts={self.num_experts} experts, got {self.experts_per_token}")
        require(self.noise >= 0, "noise", f"a relative std >= 0, got {self.noise:g}")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    # A Hugging Face checkpoint folder or llama2.c .bin, local or gs://; "assets:NAME" is a model
    # shipped inside this package (the quickstart's stories260K).
    path: str = "assets:stories260K"
    dtype: Literal["float32", "bfloat16"] = "float32"
    tokenizer: Optional[str] = None  # defaults to the tokenizer files inside ``path``
    upcycle: Optional[UpcycleSpec] = None  # set: the run's policy is ``path`` upcycled into a mixture of experts

    def __post_init__(self):
        require(bool(self.path), "path", "a checkpoint path")
        if self.upcycle is not None:
            from rlax_core.policy.source import PREFIXES

            require(self.path.partition(":")[0] not in PREFIXES, "upcycle", "upcycles a model folder or llama2.c "
                    f".bin, not a weight store, checkpoint or adapter ({self.path})")

    def resolved_path(self) -> str:
        return resolve_asset(self.path)


OptionValue = Union[str, int, float, bool, tuple[str, ...]]
BEAM_COMMANDS = ("curate", "filter", "evaluate", "rollout", "rft")


@dataclasses.dataclass(frozen=True)
class BeamSpec:
    """Beam options of the run's pipelines.

    ``options`` hold what every pipeline of the run shares (project, region, temp_location, container
    image); ``curate``, ``filter``, ``evaluate`` and ``rollout`` hold what only that command's job
    takes (CPU machines for curation, accelerator workers for the model's jobs, Streaming Engine for
    rollouts) and win over ``options`` key by key; ``rft`` left empty takes ``filter``'s (the same
    engine on the same workers); the set options (``experiments``,
    ``dataflow_service_options``) add their entries to the shared ones instead. Flags typed on the
    command line are merged over both by the same rule (``pipelines.beam_args.merge_beam_args``);
    ``false`` drops a flag. A list value repeats its flag
    (``dataflow_service_options: [a, b]`` -> ``--dataflow_service_options=a --dataflow_service_options=b``).
    ``runner: ""`` is the local default: the DirectRunner for batch jobs, Prism for the streaming one.
    """

    runner: str = ""
    options: dict[str, OptionValue] = field(default_factory=dict)
    curate: dict[str, OptionValue] = field(default_factory=dict)
    filter: dict[str, OptionValue] = field(default_factory=dict)
    evaluate: dict[str, OptionValue] = field(default_factory=dict)
    rollout: dict[str, OptionValue] = field(default_factory=dict)
    rft: dict[str, OptionValue] = field(default_factory=dict)

    def __post_init__(self):
        for section in ("options", *BEAM_COMMANDS):
            for key in getattr(self, section):
                require(key != "runner", f"{section}.runner", "set the runner as beam.runner")
                # Beam has no such flag ("Unparseable argument"): Dataflow takes it as a service option.
                require(key != "worker_accelerator", f"{section}.worker_accelerator",
                        "not a Beam option; write dataflow_service_options: \"worker_accelerator=type:...\"")

    def args(self, command: str) -> list[str]:
        """The flags of ``command``'s job: the runner, ``options``, then the command's own section."""
        require(command in BEAM_COMMANDS, "command", f"one of {', '.join(BEAM_COMMANDS)}")
        flags = [f"--runner={self.runner}"] if self.runner else []
        own = getattr(self, command) or (self.filter if command == "rft" else {})
        shared = {key: value for key, value in self.options.items() if own.get(key) is not False}
        return flags + merge_beam_args(_flags(shared), _flags(own))


def _flags(options: dict[str, OptionValue]) -> list[str]:
    flags = []
    for key, value in options.items():
        for item in value if isinstance(value, tuple) else (value,):
            if item is True:
                flags.append(f"--{key}")
            elif item is not False:
                flags.append(f"--{key}={item}")
    return flags


@dataclasses.dataclass(frozen=True)
class RunConfig:
    run: RunSpec = field(default_factory=RunSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    engine: EngineConfig = field(default_factory=EngineConfig)
    algorithm: AlgorithmConfig = field(default_factory=lambda: get_preset("grpo"))
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    weights: Optional[WeightStoreConfig] = None
    curate: CurateConfig = field(default_factory=CurateConfig)
    filter: FilterConfig = field(default_factory=FilterConfig)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    rft: RftConfig = field(default_factory=RftConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    hardware: Optional[HardwareConfig] = None  # undeclared: nothing to plan against (rlax plan says so)
    beam: BeamSpec = field(default_factory=BeamSpec)
    sft: SftConfig = field(default_factory=SftConfig)  # rlax sft (docs/post_training.md)
    dpo: DpoConfig = field(default_factory=DpoConfig)  # rlax dpo
    # The run's stages in order, and overrides only one stage's job takes (pipelines.stages).
    stages: tuple[str, ...] = ()
    stage_overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rm: RmConfig = field(default_factory=RmConfig)  # rlax rm (docs/reward_models.md)

    def __post_init__(self):
        from pipelines.stages import check_stages

        check_stages(self.stages, self.stage_overrides, sft_data=self.sft.data)
        algorithm = self.algorithm
        if algorithm.overlong_max_length:  # DAPO's shaping must be able to fire within the run's budget
            longest = self.loop.env.max_tokens if self.loop.env is not None else self.loop.sampling.budget(self.engine)
            starts = algorithm.overlong_max_length - algorithm.overlong_cache_length
            require(starts < longest, "algorithm.overlong_max_length",
                    f"DAPO's overlong penalty starts past L_max - L_cache = {starts} tokens, and this run's samples "
                    f"hold at most {longest} (loop.sampling.max_new_tokens, else engine.max_new_tokens; an episode's "
                    "env.max_tokens): it would never apply. Set algorithm.overlong_max_length (and "
                    "overlong_cache_length) to the run's budget, or 0 to turn the shaping off")

    def rows_per_step(self) -> int:
        """Rollouts one trainer step learns from: ``trainer.groups_per_step`` groups of
        ``loop.sampling.samples_per_prompt`` samples."""
        return self.trainer.groups_per_step * self.loop.sampling.samples_per_prompt

    def rollout_root(self) -> str:
        """The rollout store's folder: rollout groups, written by ``rlax rollout``, read by ``rlax train``."""
        return f"{self.run.output_dir.rstrip('/')}/rollouts"

    def metrics_dir(self) -> str:
        """The trainer's metrics (``metrics.jsonl`` + TensorBoard), local or gs://."""
        return self.run.metrics_dir or f"{self.run.output_dir.rstrip('/')}/metrics"

    def loop_metrics_dir(self) -> str:
        """``rlax launch``'s per-step loop metrics, the trainer's joined with the rollout side's."""
        if self.run.metrics_dir:
            return f"{self.run.metrics_dir.rstrip('/')}/loop"
        return f"{self.run.output_dir.rstrip('/')}/loop"

    def policy_path(self) -> str:
        """The checkpoint the run's policy starts from: ``model.path``, or with ``model.upcycle`` the
        mixture of experts made from it in the run folder (``pipelines.initial_policy`` writes it)."""
        if self.model.upcycle is None:
            return self.model.resolved_path()
        return f"{self.run.output_dir.rstrip('/')}/{UPCYCLED_MODEL}"

    def weight_store(self) -> WeightStoreConfig:
        """The parameter server's config; by default a folder under the run's output."""
        if self.weights is not None:
            return self.weights
        return WeightStoreConfig(root=f"{self.run.output_dir.rstrip('/')}/weights", run_id=self.run.name)


def resolve_asset(path: str) -> str:
    """``assets:NAME`` -> the folder shipped in ``pipelines/assets/NAME``; other paths unchanged."""
    if not path.startswith("assets:"):
        return path
    folder = ASSETS_DIR / path.split(":", 1)[1]
    if not folder.exists():
        raise ConfigError("model.path", f"no bundled asset {path!r}; bundled: "
                          f"{', '.join(sorted(p.name for p in ASSETS_DIR.iterdir() if p.is_dir()))}")
    return str(folder)


def resolve_input(spec, key: str):
    """An InputSpec whose ``path`` or ``databases`` is ``assets:NAME/FILE``: the shipped file (``sql_tiny``)."""
    changes = {}
    for field in ("path", "databases"):
        value = getattr(spec, field, None)
        if value and value.startswith("assets:"):
            found = ASSETS_DIR / value.split(":", 1)[1]
            if not found.exists():
                raise ConfigError(f"{key}.{field}", f"no bundled asset {value!r}")
            changes[field] = str(found)
    return dataclasses.replace(spec, **changes) if changes else spec


def recipes() -> list[str]:
    """The recipes shipped with rlax (``configs/*.yaml``), by file name."""
    return sorted(path.name for path in CONFIG_DIR.glob("*.yaml"))


def find_config(path: str | Path) -> Path:
    """``path`` when it is a file; else the shipped recipe of that name (``configs/quickstart.yaml``,
    ``quickstart.yaml`` or ``quickstart``), so that recipes work from any folder once rlax is installed."""
    given = Path(path)
    if given.is_file():
        return given
    name = given.name if given.suffix in (".yaml", ".yml") else f"{given.name}.yaml"
    if (CONFIG_DIR / name).is_file() and not (given.exists() and not given.is_dir()):
        return CONFIG_DIR / name
    if given.exists():  # a folder, a device, a pipe: said as such (rlax_core.config.check_config_file)
        check_config_file(given)
    raise ConfigError("", f"config file not found: {path} (recipes shipped with rlax: {', '.join(recipes())})")


def load_run_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """YAML file (``base:`` inheritance allowed) + dotted overrides -> a validated ``RunConfig``."""
    data = read_yaml(find_config(path)) if path else {}
    return _build(apply_overrides(data, overrides))


def load_section(path: str | Path | None, overrides: Sequence[str], section: str) -> RunConfig:
    """The run config of one pipeline's entry point.

    A file holding none of the run's sections is that pipeline's ``section`` alone, and overrides
    that name no section (``limit=5``) are that section's (``filter.limit=5``).
    """
    sections = {f.name for f in dataclasses.fields(RunConfig)}
    data = read_yaml(find_config(path)) if path else {}
    if not sections & set(data):
        data = {section: data} if data else {}
    overrides = [o if o.split("=", 1)[0].split(".")[0] in sections else f"{section}.{o}" for o in overrides]
    return _build(apply_overrides(data, overrides))


def require_given(section: Any, flags: dict[str, str]) -> None:
    """Fail naming the flag and the config key of the first required field left empty.

    ``flags`` maps a dotted field of ``section`` (``generation.model``) to the flag that sets it.
    """
    for key, flag in flags.items():
        if not operator.attrgetter(key)(section):
            raise ConfigError(key, f"missing: give {flag} or {key} in --config")


def _build(data: dict[str, Any]) -> RunConfig:
    named = dict(data["algorithm"]) if isinstance(data.get("algorithm"), dict) else {}
    if isinstance(data.get("algorithm"), dict):  # ``preset: NAME`` plus single-field overrides
        data["algorithm"] = algorithm_from_dict(data["algorithm"])
    config = from_dict(RunConfig, data)
    config = dataclasses.replace(config, algorithm=corrected_for_engine(config.algorithm, config.engine.eight_bit, named))
    if config.model.upcycle is not None:  # a model that cannot be upcycled is refused here, by its key
        policy_shape(config)
    return resolve_auto_pages(config)


def resolve_auto_pages(config):
    """``config`` with every ``engine.num_pages: auto`` replaced by the pages its role's chips hold
    (``planning.memory.auto_num_pages``); a ``ConfigError`` where no chip is declared to size it by."""
    def resolved(engine, role: str, path: str, dtype: str, lora=None):
        if engine.num_pages != "auto":
            return engine
        from rlax_core.models.checkpoint import read_model_config  # JAX's: not for a config without "auto"
        from rlax_core.planning.memory import auto_num_pages

        hardware = config.hardware.workers_of(role) if config.hardware is not None else None
        if hardware is None or not path:
            raise ConfigError(f"{'engine' if role == 'rollout' else role + '.generation.engine'}.num_pages",
                              f"auto sizes the KV pool from the {role} chips' memory: declare hardware.{role} "
                              "(or hardware.rollout) and the model, or give a number of pages")
        shape = policy_shape(config) if role == "rollout" else read_model_config(template_of(resolve_asset(path)))
        return auto_num_pages(shape, engine, hardware, dtype, lora=lora,
                              beside=scoring_models_beside(config) if role == "rollout" else None)

    engine = resolved(config.engine, "rollout", config.model.path, config.model.dtype, config.trainer.lora)
    generations = {}
    for role, section, path in (("filter", config.filter, config.filter.generation.model),
                                ("evaluate", config.evaluate, (config.evaluate.models or ("",))[0])):
        spec = section.generation
        generations[role] = dataclasses.replace(section, generation=dataclasses.replace(
            spec, engine=resolved(spec.engine, role, path, spec.dtype)))
    if engine is config.engine and all(generations[r].generation.engine is getattr(config, r).generation.engine
                                       for r in generations):
        return config
    return dataclasses.replace(config, engine=engine, **generations)


def scoring_models_beside(run_config) -> dict[str, int]:
    """What the scoring's models (a ``reward_model`` term's, a distillation teacher's) placed on the
    rollout workers hold on their chips beside the engine: each one's weights and one forward's
    activations (``planning.memory.scoring_model_parts``); nothing without one. Those placed on a
    stage of their own count on its chips (rlax plan's reward_model role)."""
    from rlax_core.planning.memory import scoring_model_parts

    parts = {}
    for name, shape, settings in scoring_models(run_config, "rollout_worker"):
        parts.update(scoring_model_parts(shape, settings.batch_size, settings.max_length, settings.dtype, name))
    return parts


def scoring_models(run_config, placement: str) -> list[tuple]:
    """(name, ``ModelConfig``, settings) of each model the scoring runs at ``placement``
    ("rollout_worker" or "own_stage"): the ``reward_model`` term's ("reward model") and the
    distillation teacher's ("teacher"; ``rewards.reward_model.placed_models`` names them)."""
    from rlax_core.models.checkpoint import read_model_config
    from rlax_core.rewards.reward_model import placed_models

    rewards = run_config.loop.rewards
    if rewards is None:
        return []
    out = []
    for key, settings in placed_models(rewards).items():
        if settings.placement != placement:
            continue
        if key == "reward_model":
            out.append(("reward model", reward_model_shape(run_config), settings))
        else:  # the teacher: a causal language model
            out.append(("teacher", read_model_config(template_of(resolve_asset(settings.teacher))), settings))
    return out


def reward_model_shape(run_config):
    """The ``ModelConfig`` of the run's ``reward_model`` term (a score head), read from its folder; a
    run that makes its reward model first (an ``rm`` stage) makes it of the policy's shape."""
    from rlax_core.models.checkpoint import read_model_config

    if "rm" in run_config.stages:  # not there until the run's rm stage has trained it
        return dataclasses.replace(policy_shape(run_config), score_head=True)
    shape = read_model_config(resolve_asset(run_config.loop.rewards.reward_model.path))
    if shape.moe is None:  # a published causal shape named for the reward model: its score head, no classifier
        shape = dataclasses.replace(shape, score_head=True)
    return shape


def policy_shape(run_config):
    """The ``ModelConfig`` of the run's policy, read from its checkpoint; with ``model.upcycle``, the
    mixture's shape computed from the dense one (nothing is written). ``ConfigError`` at
    ``model.upcycle`` when that model cannot be upcycled (not a dense Llama)."""
    from rlax_core.models.checkpoint import read_model_config
    from rlax_core.models.upcycle import upcycled_config

    model = run_config.model
    shape = read_model_config(template_of(model.resolved_path()))
    if model.upcycle is None:
        return shape
    try:
        return upcycled_config(shape, num_experts=model.upcycle.num_experts,
                               experts_per_token=model.upcycle.experts_per_token)
    except ConfigError as error:
        raise ConfigError("model.upcycle", f"model.path {model.path}: {error.message}") from None


def template_of(spec: str) -> str:
    """Where the shape of ``model.path`` is written: the checkpoint itself, or the model template beside
    a weight store's versions or a checkpoint folder's steps. A remote plain path is not probed."""
    from rlax_core.policy.source import PREFIXES, parse_policy_source
    from rlax_core.utils.paths import is_remote

    if spec.partition(":")[0] in PREFIXES or not is_remote(spec):
        return parse_policy_source(spec).template
    return spec
