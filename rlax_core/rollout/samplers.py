"""How a rollout worker samples its prompt groups: one interface, two kinds, chosen once per worker.

    sampler = make_sampler(spec)                     # episodes with loop.env, else completions
    requests = sampler.requests(host, step, slots)   # one per prompt slot
    results = sampler.generate(host, requests)       # through the process's EngineHost
    rows, texts = sampler.rows(host, results_of_one_request, example_id, group_id)
    group, failed = sampler.score(rewarder, group)   # rewards into the rows

A completion is one engine sample: its row is ``records.rollout_row`` and its policy text the
decoded completion; the reward terms score every sample. An episode is a multi-turn transcript run
by ``rlax_core.envs`` on the engine: its row holds the policy mask, the turns' versions and what
every turn returned, its policy text is the policy's tokens of every turn, and its reward is the
environment's return plus, with ``env.judge_answer``, the terms' verdict on that text.

``make_sampler`` is the only place that asks which kind a run samples; everything downstream (the
worker, the groups, the scoring stage) calls the interface. A new kind of sampling (another
environment protocol, a reward model in the loop) is one more implementation.
"""

from __future__ import annotations

import abc
import json
from typing import Any, Sequence

from rlax_core.data.records import rollout_row, scored_row
from rlax_core.envs.base import EnvConfig
from rlax_core.rewards.registry import RewardResult, Sample
from rlax_core.rewards.scorer import Rewarder, failed_samples
from rlax_core.rollout.host import EngineHost
from rlax_core.rollout.schedule import rollout_prompt_id, sample_seed
from rlax_core.rollout.spec import RolloutSpec

Slots = Sequence[tuple[int, dict]]  # (prompt slot of the step, its example)


class Sampler(abc.ABC):
    """What one worker samples for a group, and how its rows are made and scored."""

    compiles_episodes = False  # whether the engine must compile the multi-turn continuation at start-up

    def __init__(self, spec: RolloutSpec):
        self.spec = spec
        self.sampling = spec.sampling()

    @abc.abstractmethod
    def requests(self, host: EngineHost, step: int, slots: Slots) -> list:
        """One request per prompt slot of ``step``; its keys are functions of (run, step, slot) only."""

    @abc.abstractmethod
    def samples_of(self, request: Any) -> int:
        """Results one request makes (its group's size)."""

    @abc.abstractmethod
    def generate(self, host: EngineHost, requests: Sequence[Any]) -> list:
        """Every request's results, in request order, then sample index."""

    @abc.abstractmethod
    def rows(self, host: EngineHost, results: Sequence[Any], example_id: str, group_id: str
             ) -> tuple[list[dict[str, Any]], list[str]]:
        """One group's Rollout rows (not yet scored) and the policy text of each, which the reward terms judge."""

    @abc.abstractmethod
    def score(self, rewarder: Rewarder, group: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """``group`` with every row's reward and ``reward_info``, and how many samples could not be
        scored (reward 0, the reason in ``reward_info``)."""

    def distilled(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``rows`` with a teacher's per-token rewards when the run distills (``rewards.distillation``):
        the teacher is read on first use, where the scoring runs (``rewards.distillation.placement``)."""
        settings = self.spec.rewards.distillation
        if not settings.enabled or not rows:
            return rows
        from rlax_core.rewards.distillation import Teacher, distill_rows

        if getattr(self, "_teacher", None) is None:  # its weights and forward are held once per process
            self._teacher = Teacher(settings, self.spec.model_path)
        return distill_rows(self._teacher, rows)

    def _samples(self, group: dict[str, Any]) -> list[Sample]:
        return [Sample(group["example"], text, row["finish_reason"], len(row["completion_ids"]))
                for row, text in zip(group["rows"], group["texts"])]


class CompletionSampler(Sampler):
    """One engine completion per sample."""

    def requests(self, host: EngineHost, step: int, slots: Slots) -> list:
        from rlax_core.inference.sequences import Request

        spec = self.spec
        return [Request(host.prompt_ids(example), self.sampling, prompt_id=rollout_prompt_id(spec.run, step, slot),
                        seed=sample_seed(spec.run_seed, step)) for slot, example in slots]

    def samples_of(self, request: Any) -> int:
        return request.sampling.samples_per_prompt

    def generate(self, host: EngineHost, requests: Sequence[Any]) -> list:
        return host.generate(requests)

    def rows(self, host: EngineHost, results: Sequence[Any], example_id: str, group_id: str
             ) -> tuple[list[dict[str, Any]], list[str]]:
        rows = [rollout_row(c, example_id=example_id, group_id=group_id) for c in results]
        return rows, [host.decode(c.completion_ids) for c in results]

    def score(self, rewarder: Rewarder, group: dict[str, Any]) -> tuple[dict[str, Any], int]:
        results = rewarder.score_many(self._samples(group)) if group["rows"] else []
        rows = [scored_row(row, *result) for row, result in zip(group["rows"], results)]
        return {**group, "rows": self.distilled(rows)}, failed_samples(results)


class EpisodeSampler(Sampler):
    """One multi-turn episode of ``loop.env`` per sample (docs/multi_turn.md)."""

    compiles_episodes = True

    def __init__(self, spec: RolloutSpec):
        super().__init__(spec)
        self.env: EnvConfig = spec.loop.env

    def requests(self, host: EngineHost, step: int, slots: Slots) -> list:
        from rlax_core.envs.runner import EpisodeStart

        spec = self.spec
        return [EpisodeStart(example, rollout_prompt_id(spec.run, step, slot), sample_seed(spec.run_seed, step),
                             self.sampling.samples_per_prompt) for slot, example in slots]

    def samples_of(self, request: Any) -> int:
        return request.samples

    def generate(self, host: EngineHost, requests: Sequence[Any]) -> list:
        return host.run_episodes(self.env, requests, self.sampling)

    def rows(self, host: EngineHost, results: Sequence[Any], example_id: str, group_id: str
             ) -> tuple[list[dict[str, Any]], list[str]]:
        # Its reward so far is the environment's return, to which ``score`` adds the terms' verdict.
        rows = [{"example_id": example_id, "group_id": group_id, "sample_idx": episode.sample_index,
                 "reward_info": None, **episode.rollout_fields()} for episode in results]
        return rows, [host.decode(episode.policy_token_ids()) for episode in results]

    def score(self, rewarder: Rewarder, group: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """An episode's reward is its environment's return plus, with ``env.judge_answer``, the terms'
        score of its policy text; its ``reward_info`` holds both, and ``pass`` from the terms (without
        them, from the episode's last turn)."""
        rows = group["rows"]
        judged: list[RewardResult | None] = (rewarder.score_many(self._samples(group)) if self.env.judge_answer and rows
                                             else [None] * len(rows))
        scored = []
        for row, verdict in zip(rows, judged):
            turns = json.loads(row["episode"])["turns"]
            reward, info = verdict or (0.0, {"pass": bool(turns) and bool(turns[-1]["info"].get("pass", False))})
            scored.append(scored_row(row, row["reward"] + reward, {**info, "env_return": row["reward"],
                                                                   "turn_rewards": [turn["reward"] for turn in turns]}))
        return {**group, "rows": self.distilled(scored)}, failed_samples([v for v in judged if v is not None])


def make_sampler(spec: RolloutSpec) -> Sampler:
    """The run's kind of sampling: episodes of ``loop.env`` when it names one, else completions."""
    return CompletionSampler(spec) if spec.loop.env is None else EpisodeSampler(spec)
