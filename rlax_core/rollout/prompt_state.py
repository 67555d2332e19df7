"""Per-prompt state the curriculum draws from, made only of groups that are written and scored.

For each prompt (by example id): samples and passes seen, the latest group's pass rate and a moving
average of them, the step it was last drawn and the policy version that scored it, how many of its
groups all passed (``solved_draws``) and how many samples in a row failed (``failed_streak``).

The rule that makes it replayable: the state step ``s`` draws from is ``fold(seed, scores of steps
0 .. s - k - 1)`` where ``k`` is ``trainer.max_staleness``. Pacing lets step ``s`` be generated only
once the trainer holds version ``s - k``, i.e. has trained steps ``<= s - k - 1``, which it does only
when each of them is complete in the store: every group written, or the step marked generated after
its dropped groups' scores were recorded (``RolloutStore.write_dropped_scores``). So those scores
exist, and are final, before step ``s`` is drawn, whichever job draws it and whenever. A group in
flight (of a later step, or of an incomplete one) never enters: a pass rate is passes over samples
of completed groups only (NeMo labs-molt PR 50 divided by dispatched groups). The filter's pass rate
and sample count seed each prompt (``seeded``), as if its base-model samples had been one group.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Iterable, Sequence

import numpy as np

from rlax_core.data.rollout_store import GroupKey, RolloutStore


@dataclasses.dataclass(frozen=True)
class GroupScore:
    """One completed group's outcome: the fields the state needs, from its rows."""

    slot: int
    example_id: str
    samples: int
    passes: int
    policy_version: int


@dataclasses.dataclass
class PromptState:
    samples: int = 0
    passes: int = 0
    latest: float | None = None  # the newest group's pass rate (or the filter's)
    ema: float | None = None  # moving average of group pass rates, ``ema_weight`` for the newest
    last_step: int = -1  # the schedule step that last drew it (-1: not yet in this run)
    version: int = -1  # the policy version that scored that group
    solved_draws: int = 0  # groups whose samples all passed
    failed_streak: int = 0  # samples in a row that failed, up to the newest


@dataclasses.dataclass
class CurriculumState:
    """Every prompt's state after the scored groups of steps ``< next_step``."""

    prompts: dict[str, PromptState]
    next_step: int = 0

    @classmethod
    def seeded(cls, examples: Sequence[dict], pass_rates: Sequence[dict] = ()) -> "CurriculumState":
        """Each example's state from the difficulty filter's ``pass_rate`` and ``n_samples`` (none: unseen),
        or from ``pass_rates`` (rows of ``id``, ``pass_rate``, ``n_samples``: an exported state) where
        they name it."""
        prompts, given = {}, {row["id"]: row for row in pass_rates}
        for example in examples:
            example = {**example, **{k: v for k, v in given.get(example["id"], {}).items()
                                     if k in ("pass_rate", "n_samples")}}
            rate, n = example.get("pass_rate"), example.get("n_samples") or 0
            if rate is None or (isinstance(rate, float) and math.isnan(rate)):
                prompts[example["id"]] = PromptState()
            else:
                prompts[example["id"]] = PromptState(samples=int(n), passes=round(rate * n), latest=float(rate),
                                                     ema=float(rate))
        return cls(prompts)

    def fold(self, step: int, groups: Iterable[GroupScore], ema_weight: float) -> None:
        """Add the completed groups of ``step`` (the next one: steps fold in order), slot order."""
        if step != self.next_step:
            raise ValueError(f"curriculum state is at step {self.next_step}; cannot fold step {step}")
        for group in sorted(groups, key=lambda g: g.slot):
            state = self.prompts.setdefault(group.example_id, PromptState())
            rate = group.passes / group.samples
            state.samples += group.samples
            state.passes += group.passes
            state.latest = rate
            state.ema = rate if state.ema is None else (1 - ema_weight) * state.ema + ema_weight * rate
            state.last_step, state.version = step, group.policy_version
            state.solved_draws += group.passes == group.samples
            # Which samples of the group failed last is not ordered; a group with a pass ends the streak.
            state.failed_streak = 0 if group.passes else state.failed_streak + group.samples
        self.next_step = step + 1

    def to_json(self) -> str:
        return json.dumps({"next_step": self.next_step,
                           "prompts": {k: dataclasses.asdict(v) for k, v in sorted(self.prompts.items())}},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "CurriculumState":
        data = json.loads(text)
        return cls({k: PromptState(**v) for k, v in data["prompts"].items()}, data["next_step"])

    def table(self) -> list[dict[str, Any]]:
        """One row per prompt: ``id``, ``pass_rate`` (passes over samples, the filter's included),
        ``n_samples`` and the rest of its state: the columns the difficulty filter writes, so the next
        run's filter or curriculum can read it (``rlax_core.data.training_set``)."""
        return [{"id": k, "pass_rate": (v.passes / v.samples) if v.samples else None, "n_samples": v.samples,
                 **{f: getattr(v, f) for f in ("passes", "latest", "ema", "last_step", "version", "solved_draws",
                                               "failed_streak")}}
                for k, v in sorted(self.prompts.items())]


@dataclasses.dataclass(frozen=True)
class PromptTable:
    """The state as arrays by training-set row, what a curriculum's draw reads."""

    ids: tuple[str, ...]
    pass_rate: np.ndarray  # the moving average; NaN: no pass rate yet
    samples: np.ndarray
    last_step: np.ndarray
    retired: np.ndarray  # bool
    resting: np.ndarray  # bool

    @property
    def eligible(self) -> np.ndarray:
        return ~(self.retired | self.resting)

    @classmethod
    def of(cls, state: CurriculumState, examples: Sequence[dict], step: int, *, retire_after_solved: int = 0,
           rest_after_failed: int = 0, rest_steps: int = 1) -> "PromptTable":
        rows = [state.prompts.get(e["id"], PromptState()) for e in examples]
        solved = np.array([r.solved_draws for r in rows])
        streak = np.array([r.failed_streak for r in rows])
        last = np.array([r.last_step for r in rows])
        return cls(tuple(e["id"] for e in examples),
                   np.array([np.nan if r.ema is None else r.ema for r in rows], dtype=np.float64),
                   np.array([r.samples for r in rows]), last,
                   solved >= retire_after_solved if retire_after_solved else np.zeros(len(rows), bool),
                   ((streak >= rest_after_failed) & (step - last <= rest_steps)) if rest_after_failed
                   else np.zeros(len(rows), bool))


def read_table(path: str) -> list[dict[str, Any]]:
    """The rows of a pass-rate table (``export_table``'s, or any parquet file with ``id`` and ``pass_rate``)."""
    import fsspec
    import pyarrow.parquet as pq

    with fsspec.open(str(path), "rb") as handle:
        return pq.read_table(handle).to_pylist()


def export_table(state: CurriculumState, path) -> str:
    """``state.table()`` as a parquet file (local or any fsspec URL); returns its path."""
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq

    with fsspec.open(str(path), "wb") as handle:
        pq.write_table(pa.Table.from_pylist(state.table()), handle)
    return str(path)


def group_score(slot: int, rows: Sequence[dict]) -> GroupScore:
    """A group's score from its rows (``reward_info``'s ``pass``, the oldest ``policy_version``)."""
    passes = sum(bool(json.loads(row["reward_info"] or "{}").get("pass", False)) for row in rows)
    return GroupScore(slot, rows[0]["example_id"], len(rows), passes, min(int(r["policy_version"]) for r in rows))


def dropped_record(group: dict) -> dict:
    """What ``RolloutStore.write_dropped_scores`` keeps of a group dynamic sampling dropped."""
    score = group_score(group["key"][1], group["rows"])
    return dataclasses.asdict(score)


def step_scores(store: RolloutStore, step: int, keys: Sequence[GroupKey]) -> list[GroupScore]:
    """Every completed group of ``step``: the written ones (``keys``, a listing) and the dropped ones."""
    scores = [group_score(key.prompt_index, store.read_group(key).select(
        ["example_id", "reward_info", "policy_version"]).to_pylist()) for key in keys if key.step == step]
    written = {s.slot for s in scores}
    scores += [GroupScore(**record) for slot, record in store.read_dropped_scores(step).items() if slot not in written]
    return sorted(scores, key=lambda s: s.slot)
