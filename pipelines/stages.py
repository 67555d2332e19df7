"""The stages a recipe names, and what their order must respect.

    stages: [curate, rft, sft, filter, rl, evaluate]     # configs/quickstart_warm.yaml
    stage_overrides:
      sft:
        - trainer.total_steps=40
        - trainer.optimizer.learning_rate=1.0e-3

A stage is a real entry point in its own process, run in the listed order by ``rlax launch`` for any
recipe (``pipelines.launch_stages``: each stage's job on the recipe's sections, wired to the next) and
by ``rlax quickstart`` for the story task (``pipelines.quickstart``: each stage's runner there calls
``rlax curate``, ``rlax rft``, ``rlax sft``, ``rlax filter`` or ``rlax launch``; ``rm`` runs ``rlax
rft`` for preference pairs, then ``rlax rm``, and the ``reward_model`` term reads the model it
makes); ``stage_overrides`` are dotted overrides that only that stage's job takes (the SFT job reads
the same ``trainer:`` section as the RL trainer, so its steps and learning rate are set here). A
recipe that names no stages runs the quickstart's own ``curate -> filter -> rl -> evaluate`` (and
``rlax launch``'s trainer and rollout stream alone).

With ``sft`` among the stages the run is warm-started: the policy every later stage samples (the
filter) and trains (``rl``) is the SFT job's final Hugging Face export, not ``model.path``. So an
``rl`` listed before ``sft`` would not be warm-started at all and is refused, as is an ``rl`` before
``rm`` (the reward model it is paid by would not exist yet), and an unknown or
repeated stage, an ``sft`` with neither an ``rft`` stage before it nor ``sft.data``, and a stage that
reads prompts (``rft``, ``rm``, ``filter``, ``rl``) without ``curate`` before it: each in one line
(``ConfigError`` on the ``stages`` key). Kept free of heavy imports: ``pipelines.config`` checks a
recipe's stages with it as the recipe loads.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from rlax_core.config import require

STAGES = ("curate", "rft", "rm", "sft", "filter", "rl", "evaluate")
DEFAULT_STAGES = ("curate", "filter", "rl", "evaluate")  # the quickstart's, when a recipe names none
READS_PROMPTS = ("rft", "rm", "filter", "rl")  # these sample the curated prompts


def check_stages(stages: Sequence[str], overrides: Mapping[str, Sequence[str]] = {}, *, sft_data: str = "") -> None:
    """Raise ``ConfigError`` (one line) unless ``stages`` is an order the run can follow."""
    for name in stages:
        require(name in STAGES, "stages", f"unknown stage {name!r}; the stages are {', '.join(STAGES)}")
    repeated = sorted({name for name in stages if list(stages).count(name) > 1})
    require(not repeated, "stages", f"stage {', '.join(repeated)} is listed more than once")
    at = {name: i for i, name in enumerate(stages)}
    if "sft" in at and "rl" in at:
        require(at["rl"] > at["sft"], "stages", "rl comes before sft, but a warm start trains RL from the SFT "
                "stage's final version: list sft before rl")
    if "rm" in at and "rl" in at:
        require(at["rl"] > at["rm"], "stages", "rl comes before rm, but the rm stage trains the reward model "
                "the rl stage is paid by: list rm before rl")
    if "sft" in at:
        require(at.get("rft", len(stages)) < at["sft"] or bool(sft_data), "stages",
                "sft has no data: list rft before sft (its verified samples), or set sft.data to your SFT set")
    for name in READS_PROMPTS:
        if name in at:
            require(at.get("curate", len(stages)) < at[name], "stages",
                    f"{name} samples the curated prompts: list curate before {name}")
    for name in overrides:
        require(name in at, f"stage_overrides.{name}", f"not a stage of this run (stages: {', '.join(stages) or 'none'})")


def warm_start(stages: Sequence[str]) -> bool:
    """Whether the RL stage starts from the SFT stage's final version."""
    return "sft" in stages and "rl" in stages
