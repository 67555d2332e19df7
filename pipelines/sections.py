"""The run config's sections for the Beam pipelines, in a module that imports no Beam.

``pipelines.config.RunConfig`` holds them beside the sections of ``rlax_core``; keeping them here,
rather than in the Beam modules that read them, lets ``rlax train`` (and anything else that only
reads a config) load the whole run config without importing Beam::

    filter:    FilterConfig    (``rlax filter``, pipelines/filter_difficulty.py)
    evaluate:  EvaluateConfig  (``rlax evaluate``, pipelines/evaluate.py)
    rft:       RftConfig       (``rlax rft``, pipelines/rft.py)
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import rlax_core.tasks  # noqa: F401  (registers the tasks' reward terms before configs name them)
from rlax_core.config import require
from rlax_core.data.curation import InputSpec
from rlax_core.data.rejection_sampling import SampleSelection
from rlax_core.inference.config import GenerationSpec
from rlax_core.rewards.config import RewardConfig
from rlax_core.rewards.registry import reward_names


def _require_registered(task_terms: dict[str, str]) -> None:
    """Each task's verdict term is registered (after the section's ``rewards`` imported its own modules)."""
    known = reward_names()
    for task, term in task_terms.items():
        require(term in known, f"task_terms.{task}", f"a registered reward term; known: {', '.join(known)}")


@dataclasses.dataclass(frozen=True)
class FilterConfig:
    input: str = ""  # Example rows: curate's parquet shards or a jsonl of Example rows (glob; local or gs://)
    input_format: str = "auto"  # Example rows are detected; raw layouts (gsm8k, math, ...) are adapted on the fly
    output: str = ""
    generation: GenerationSpec = GenerationSpec()
    low: float = 0.1  # keep prompts with low <= pass rate <= high
    high: float = 0.9
    limit: int = 0  # only the first N prompts by id (0: all)
    model_version: str = ""  # recorded in filter_model_version; default: the model's label
    # A user's own rewards decide the pass rate as they decide evaluate's verdicts (see EvaluateConfig).
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    task_terms: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        require(0.0 <= self.low <= self.high <= 1.0, "low", "0 <= low <= high <= 1")
        require(self.limit >= 0, "limit", "an integer >= 0")
        _require_registered(self.task_terms)


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    models: tuple[str, ...] = ()  # checkpoints, evaluated side by side
    model_names: tuple[str, ...] = ()  # labels in the report (default: folder names)
    eval_sets: tuple[InputSpec, ...] = ()  # named by source, else folder/file (e.g. gsm8k/test)
    generation: GenerationSpec = GenerationSpec()  # sampling settings shared by every model
    # A user's own rewards: rewards.modules / rewards.functions are imported on every worker, and
    # task_terms maps a task to the term whose ``pass`` is a sample's verdict (over the built-in
    # rlax_core.eval.verify.TASK_TERMS), e.g. {story: my_story_rule}.
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    task_terms: dict[str, str] = dataclasses.field(default_factory=dict)
    ks: tuple[int, ...] = (1, 4, 8)
    limit: int = 0  # prompts per evaluation set, the first N by id (0: all)
    output: str = ""
    title: str = "Evaluation"

    def __post_init__(self):
        require(all(k >= 1 for k in self.ks) and len(self.ks) > 0, "ks", "positive integers")
        require(self.limit >= 0, "limit", "an integer >= 0")
        _require_registered(self.task_terms)

    @property
    def labels(self) -> list[str]:
        return list(self.model_names) or [dataclasses.replace(self.generation, model=m).label for m in self.models]


@dataclasses.dataclass(frozen=True)
class RftConfig:
    """``rlax rft``: each prompt sampled ``generation.sampling.samples_per_prompt`` times by the
    generator and verified as the filter does; the verified samples kept as SFT rows and, against
    the failed ones, as preference pairs (``rlax_core.data.rejection_sampling``)."""

    input: str = ""  # Example rows, as for rlax filter (glob; local or gs://)
    input_format: str = "auto"
    output: str = ""
    # The model that writes the samples: "" is the run's policy (model.path); a teacher (a bigger
    # model: distillation data) is a model folder or .bin, weights:ROOT@VERSION or checkpoint:DIR@STEP
    # (rlax_core.policy.source). A store or checkpoint folder names its version: the rows record it.
    generator: str = ""
    generation: GenerationSpec = GenerationSpec()  # sampling and engine; its model is the generator
    max_per_prompt: int = 4  # SFT rows per prompt at most (0: pairs only)
    selection: Literal["shortest", "random"] = "shortest"  # which verified samples come first
    seed: int = 0  # the random selection's seed
    pairs_per_prompt: int = 0  # (verified, failed) preference pairs per prompt at most (0: none)
    limit: int = 0  # only the first N prompts by id (0: all)
    rewards: RewardConfig = dataclasses.field(default_factory=RewardConfig)  # as FilterConfig's
    task_terms: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        self.sample_selection()  # validates max_per_prompt, selection, pairs_per_prompt by their keys
        require(self.limit >= 0, "limit", "an integer >= 0")
        require(not self.generation.model, "generation.model", "name the model that writes the samples as "
                "rft.generator (empty: the run's policy, model.path)")
        require(self.generation.engine.num_pages != "auto", "generation.engine.num_pages",
                "a number of pages (auto sizes only the rollout, filter and evaluate engines)")
        prefix, _, rest = self.generator.partition(":")
        if prefix in ("weights", "checkpoint") and rest and not rest.startswith("//"):
            require("@" in rest, "generator", f"{self.generator}: name the version ({prefix}:PATH@N), which "
                    "the rows record as their generator; the newest may change while workers load it")
        _require_registered(self.task_terms)

    def generation_spec(self) -> GenerationSpec:
        """The generator's model with the section's sampling and engine (``rlax rft`` resolves an empty
        generator to the run's policy first)."""
        require(bool(self.generator), "generator", "the model that writes the samples")
        return dataclasses.replace(self.generation, model=self.generator)

    def sample_selection(self) -> SampleSelection:
        return SampleSelection(max_per_prompt=self.max_per_prompt, selection=self.selection, seed=self.seed,
                               pairs_per_prompt=self.pairs_per_prompt)
