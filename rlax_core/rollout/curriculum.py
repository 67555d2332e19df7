"""``loop.curriculum``: which prompts schedule step ``s`` draws, chosen once per loop (docs/curriculum.md).

    curriculum = make_curriculum(loop.curriculum)          # the kind, from the registry
    rows = curriculum.draw(prompts, step, run_seed, count)  # prompts: a PromptTable (prompt_state.py)

A curriculum is a pure function of (the prompts' state, step, run seed): the state it is given is made
only of scored groups of steps ``<= s - k - 1`` (``prompt_state``), which are committed before step
``s`` may be generated, so a restarted or preempted rollout job draws exactly the same rows.

Kinds (``CURRICULA``, a registry that refuses a taken name):

* ``uniform`` (default): today's schedule, the epoch permutation of ``schedule.prompt_indices``; it
  reads no state unless a retire or rest setting is on (then it draws evenly among eligible prompts).
* ``difficulty_pools``: hard / normal / easy pools by pass rate (``hard_below``, ``easy_above``), each
  with its weight; prompts without any pass rate weigh ``unseen_weight`` (prime-rl's DifficultyPools).
* ``balanced``: weight ``4 p (1 - p)`` (1 at p = 0.5), never below ``balanced_floor`` (arXiv 2504.03380).

Every kind obeys ``retire_after_solved`` (a prompt whose groups all passed that many times is drawn
no more) and ``rest_after_failed`` (after that many failed samples in a row a prompt sits out
``rest_steps`` steps after its last draw). A user's kind is a module (``modules``) that registers a
function ``fn(prompts, step, seed, count) -> rows`` or a ``Curriculum`` class with
``@register_curriculum(name)``; it is imported on every worker, as a user's reward modules are.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Sequence

import numpy as np

from rlax_core.config import ConfigError, require
from rlax_core.rollout.schedule import mix_seed, prompt_indices
from rlax_core.utils.paths import is_remote
from rlax_core.utils.registry import Registry
from rlax_core.utils.user_modules import UserModuleError, import_user_module

CURRICULA = Registry("curriculum")


def register_curriculum(name: str) -> Callable[[Any], Any]:
    """Decorator: a ``Curriculum`` subclass or a function ``fn(prompts, step, seed, count)`` under ``name``."""
    return CURRICULA.register(name)


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    """``loop.curriculum``: the kind and its settings (on the command line: ``loop.curriculum.kind=balanced``)."""

    kind: str = "uniform"
    modules: tuple[str, ...] = ()  # a user's modules or .py files that register kinds (imported on every worker)
    # A table of per-prompt pass rates (``id``, ``pass_rate``, ``n_samples``: an exported state, or the
    # filter's output) that seeds the state instead of the training set's own pass rates; "": none.
    seed_from: str = ""
    ema_weight: float = 0.5  # the newest group's share of a prompt's moving-average pass rate
    retire_after_solved: int = 0  # draws whose group all passed before a prompt is retired; 0: never
    rest_after_failed: int = 0  # failed samples in a row before a prompt rests; 0: never
    rest_steps: int = 4  # how many steps after its last draw a resting prompt sits out
    hard_below: float = 0.2  # difficulty_pools: pass rate below this is hard
    easy_above: float = 0.8  # difficulty_pools: pass rate above this is easy
    hard_weight: float = 0.2
    normal_weight: float = 1.0
    easy_weight: float = 0.2
    unseen_weight: float = 1.0  # a prompt with no pass rate yet (neither the filter's nor the loop's)
    balanced_floor: float = 0.05  # balanced: the least weight of any eligible prompt

    def __post_init__(self):
        import_curriculum_modules(self.modules)
        require(self.kind in CURRICULA, "kind", f"one of {CURRICULA.names()} (modules may register more)")
        require(not self.seed_from or is_remote(self.seed_from) or os.path.exists(self.seed_from), "seed_from",
                f"no such file: {self.seed_from}")
        require(0 < self.ema_weight <= 1, "ema_weight", "in (0, 1]")
        require(self.retire_after_solved >= 0, "retire_after_solved", ">= 0 (0: never)")
        require(self.rest_after_failed >= 0, "rest_after_failed", ">= 0 (0: never)")
        require(self.rest_steps >= 1, "rest_steps", "at least 1")
        require(0 <= self.hard_below <= self.easy_above <= 1, "hard_below", "0 <= hard_below <= easy_above <= 1")
        for key in ("hard_weight", "normal_weight", "easy_weight", "unseen_weight", "balanced_floor"):
            require(getattr(self, key) >= 0, key, ">= 0")

    @property
    def excludes(self) -> bool:
        """Whether a retire or rest setting is on (then even ``uniform`` reads the state)."""
        return bool(self.retire_after_solved or self.rest_after_failed)


def import_curriculum_modules(modules: Sequence[str]) -> None:
    """``modules`` imported once per process (a config's ``__post_init__`` and every worker's setup)."""
    for index, spec in enumerate(modules):
        try:
            import_user_module(spec, "curriculum")
        except UserModuleError as error:
            raise ConfigError(f"modules[{index}]", str(error)) from None


class Curriculum:
    """Draws one step's rows: ``weights`` says how much each eligible prompt is wanted."""

    reads_state = True  # whether draws depend on the prompts' state (uniform without exclusions: no)

    def __init__(self, config: CurriculumConfig):
        self.config = config

    def weights(self, prompts) -> np.ndarray:
        """A weight >= 0 per row of ``prompts`` (a PromptTable); ineligible rows are zeroed afterwards."""
        return np.ones(len(prompts.ids))

    def pools(self, prompts) -> dict[str, int]:
        """Pool sizes for the step's metrics (eligible prompts only)."""
        return {"eligible": int(prompts.eligible.sum())}

    def draw(self, prompts, step: int, seed: int, count: int) -> list[int]:
        weights = np.where(prompts.eligible, np.asarray(self.weights(prompts), dtype=np.float64), 0.0)
        return weighted_draw(weights, step, seed, count)


def weighted_draw(weights: np.ndarray, step: int, seed: int, count: int) -> list[int]:
    """``count`` rows, without replacement while rows of positive weight last, seeded by (seed, step)
    only. Short of such rows, the rest come evenly from the others (and repeat only past every row)."""
    rng = np.random.default_rng(mix_seed("curriculum", seed, step))
    wanted = np.flatnonzero(weights > 0)
    take = min(count, len(wanted))
    rows = list(rng.choice(wanted, size=take, replace=False, p=weights[wanted] / weights[wanted].sum())) if take else []
    while len(rows) < count:
        others = np.setdiff1d(np.arange(len(weights)), rows) if len(rows) < len(weights) else np.arange(len(weights))
        rows += list(rng.choice(others, size=min(count - len(rows), len(others)), replace=False))
    return [int(row) for row in rows]


@register_curriculum("uniform")
class Uniform(Curriculum):
    """Today's permutation; with retire or rest settings, an even draw among eligible prompts."""

    def __init__(self, config: CurriculumConfig):
        super().__init__(config)
        self.reads_state = config.excludes

    def draw(self, prompts, step: int, seed: int, count: int) -> list[int]:
        if not self.reads_state:
            return prompt_indices(seed, step, len(prompts.ids), count)
        return super().draw(prompts, step, seed, count)


@register_curriculum("difficulty_pools")
class DifficultyPools(Curriculum):
    """Hard / normal / easy by pass rate, each pool with its weight; no pass rate: ``unseen_weight``."""

    def _pool_of(self, prompts) -> np.ndarray:
        rate, c = prompts.pass_rate, self.config
        return np.where(np.isnan(rate), "unseen", np.where(rate < c.hard_below, "hard",
                                                            np.where(rate > c.easy_above, "easy", "normal")))

    def weights(self, prompts) -> np.ndarray:
        c = self.config
        weight = {"unseen": c.unseen_weight, "hard": c.hard_weight, "normal": c.normal_weight, "easy": c.easy_weight}
        return np.array([weight[pool] for pool in self._pool_of(prompts)], dtype=np.float64)

    def pools(self, prompts) -> dict[str, int]:
        pools = self._pool_of(prompts)[prompts.eligible]
        return {**super().pools(prompts), **{name: int((pools == name).sum())
                                             for name in ("hard", "normal", "easy", "unseen")}}


@register_curriculum("balanced")
class Balanced(Curriculum):
    """Weight ``4 p (1 - p)``, at least ``balanced_floor``: prompts the policy solves about half the time."""

    def weights(self, prompts) -> np.ndarray:
        rate = prompts.pass_rate
        spread = np.where(np.isnan(rate), self.config.unseen_weight, 4 * np.nan_to_num(rate) * (1 - np.nan_to_num(rate)))
        return np.maximum(spread, self.config.balanced_floor)

    def pools(self, prompts) -> dict[str, int]:
        rate = prompts.pass_rate[prompts.eligible]
        seen = rate[~np.isnan(rate)]
        return {**super().pools(prompts), "near_half": int(((seen >= 0.25) & (seen <= 0.75)).sum()),
                "unseen": int(np.isnan(rate).sum())}


class FunctionCurriculum(Curriculum):
    """A user's function ``fn(prompts, step, seed, count) -> rows``; its rows are checked."""

    def __init__(self, config: CurriculumConfig, function: Callable[..., Sequence[int]]):
        super().__init__(config)
        self.function = function

    def draw(self, prompts, step: int, seed: int, count: int) -> list[int]:
        rows = [int(row) for row in self.function(prompts, step, seed, count)]
        if len(rows) != count or not all(0 <= row < len(prompts.ids) for row in rows):
            raise ValueError(f"curriculum {self.config.kind!r} drew {rows[:8]}{'...' if len(rows) > 8 else ''} for "
                             f"step {step}: it must return {count} rows in 0..{len(prompts.ids) - 1}")
        return rows


def make_curriculum(config: CurriculumConfig) -> Curriculum:
    """The loop's curriculum (its modules imported first: on a worker the config arrives pickled, as names)."""
    import_curriculum_modules(config.modules)
    kind = CURRICULA.get(config.kind)
    if kind is None:
        raise ConfigError("loop.curriculum.kind", f"{config.kind!r} is not registered here: one of {CURRICULA.names()}")
    if isinstance(kind, type) and issubclass(kind, Curriculum):
        return kind(config)
    return FunctionCurriculum(config, kind)
