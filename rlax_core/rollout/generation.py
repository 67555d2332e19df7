"""Work units in, rollout groups out: what ``GenerateRollouts`` does, without Beam.

A group is a plain dict, cheap to pickle between Beam stages: ``key`` (step, prompt slot),
``example``, ``rows`` (Rollout rows, ``rlax_core.data.records``), ``texts`` (decoded completions;
of an episode, the policy's tokens of every turn, which the reward terms judge),
``generate_seconds`` (its share of the engine call), ``worker`` and ``timeline`` (wall clocks of
the step's timeline, ``rlax_core.utils.timeline``).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Sequence

from rlax_core.data.records import rollout_row, scored_row
from rlax_core.data.rollout_store import GroupKey
from rlax_core.rewards.registry import Sample
from rlax_core.rewards.scorer import Rewarder, failed_samples
from rlax_core.rollout.schedule import WorkUnit, prompt_indices
from rlax_core.rollout.worker import RolloutWorker


@dataclasses.dataclass
class GeneratedUnits:
    """Per unit, its groups (or None: the newest usable weights were too old for its step)."""

    units: list[WorkUnit]
    groups: list[list[dict[str, Any]] | None]
    loaded: int | None  # the weight version the engine generated with (None: no usable weights)
    refused: int  # weight versions newly refused while generating

    @property
    def deferred_steps(self) -> list[int]:
        """Steps of units left ungenerated: the schedule offers them again once fresher weights verify."""
        return sorted({unit.step for unit, groups in zip(self.units, self.groups) if groups is None})


def generate_units(worker: RolloutWorker, examples: Sequence[dict], units: Sequence[tuple[WorkUnit, int]]
                   ) -> GeneratedUnits:
    """Generate ``units`` (each with the newest version its thread knows) in one combined engine call.

    A unit may use weights no older than ``step - max_staleness``; the engine generates with the
    newest version any of them knows of (fresher weights only lower staleness).
    """
    spec = worker.spec
    store = spec.store()
    per_unit = []  # per unit: [(slot, example)] and its requests
    for unit, _ in units:
        step_rows = prompt_indices(spec.run_seed, unit.step, len(examples), spec.prompts_per_step)
        slots = [(slot, examples[step_rows[slot]]) for slot in unit.slots]
        per_unit.append((slots, worker.requests(unit.step, slots)))
    batch = worker.generate([(requests, unit.step - spec.max_staleness) for (unit, _), (_, requests)
                             in zip(units, per_unit)], max(version for _, version in units))
    groups_made = sum(len(slots) for (slots, _), result in zip(per_unit, batch.results) if result is not None)
    out: list[list[dict[str, Any]] | None] = []
    for (unit, _), (slots, requests), completions in zip(units, per_unit, batch.results):
        if completions is None:
            out.append(None)
            continue
        by_prompt: dict[str, list] = {}
        for completion in completions:
            by_prompt.setdefault(completion.prompt_id, []).append(completion)
        groups = []
        for (slot, example), request in zip(slots, requests):
            key = GroupKey(unit.step, slot)
            samples = sorted(by_prompt[request.prompt_id], key=lambda c: c.sample_index)
            if spec.loop.env is None:
                rows = [rollout_row(c, example_id=example["id"], group_id=store.group_id(key)) for c in samples]
                texts = [worker.host.decode(c.completion_ids) for c in samples]
            else:
                rows = [episode_row(e, example_id=example["id"], group_id=store.group_id(key)) for e in samples]
                texts = [worker.host.decode(e.policy_token_ids()) for e in samples]
            groups.append({
                "key": (key.step, key.prompt_index), "example": example, "rows": rows, "texts": texts,
                "generate_seconds": batch.seconds / groups_made, "worker": worker.name,
                "timeline": {"scheduled_version": unit.version, "version_seen_t": unit.version_seen_t,
                             "scheduled_t": unit.scheduled_t, **batch.timeline}})
        out.append(groups)
    return GeneratedUnits([unit for unit, _ in units], out, batch.loaded, batch.refused)


def episode_row(episode, *, example_id: str, group_id: str) -> dict[str, Any]:
    """The Rollout row of one episode (``rlax_core.envs.Episode``): its reward so far is the
    environment's return, to which ``score_group`` adds the reward terms' verdict (``env.judge_answer``)."""
    return {"example_id": example_id, "group_id": group_id, "sample_idx": episode.sample_index,
            "reward_info": None, **episode.rollout_fields()}


def score_group(rewarder: Rewarder, group: dict[str, Any], judge_answer: bool = True) -> tuple[dict[str, Any], int]:
    """``group`` with every sample scored by ``rewarder``, and
    how many samples could not be scored (reward 0, the reason in ``reward_info``).

    An episode's reward is its environment's return plus, with ``judge_answer``, the terms' score of
    its policy text; its ``reward_info`` holds both, and ``pass`` from the terms (without them, from
    the episode's last turn)."""
    rows = group["rows"]
    judged = [i for i, row in enumerate(rows) if judge_answer or row.get("episode") is None]
    samples = [Sample(group["example"], group["texts"][i], rows[i]["finish_reason"], len(rows[i]["completion_ids"]))
               for i in judged]
    results = dict(zip(judged, rewarder.score_many(samples) if samples else []))
    scored = []
    for i, row in enumerate(rows):
        if row.get("episode") is None:
            scored.append(scored_row(row, *results[i]))
            continue
        turns = json.loads(row["episode"])["turns"]
        reward, info = results.get(i, (0.0, {"pass": bool(turns) and bool(turns[-1]["info"].get("pass", False))}))
        scored.append(scored_row(row, row["reward"] + reward, {**info, "env_return": row["reward"],
                                                               "turn_rewards": [turn["reward"] for turn in turns]}))
    return {**group, "rows": scored}, failed_samples(list(results.values()))
