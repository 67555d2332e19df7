"""Running episodes on the engine: turns interleaved under continuous batching, tools beside it.

    episodes = run_episodes(engine, tokenizer, EnvConfig(name="word_chain"), starts, sampling)

Each start is one dataset row sampled ``samples`` times (a GRPO group); each sample is an episode
with its own environment. The loop steps the engine; a finished turn parks its sequence in the
engine (pages kept, slot freed) and its text goes to the environment in a thread pool, so a slow
tool holds only its own episode while the others decode. When the environment answers, the
observation's tokens are appended and the next turn is queued; the engine computes only the new
tokens (``inference.episodes``).

The transcript is token-level: the prompt, then each turn's sampled tokens followed by its
observation's tokens, never re-tokenized, so training sees exactly the tokens the policy saw.
``policy_mask`` marks the sampled ones; ``behavior_logprobs`` holds their log-probs (0 elsewhere);
``turn_versions`` the weight version of each turn; a mixture of experts' ``routed_experts`` the
experts every position of the transcript ran (router replay). What each turn returned (observation, reward,
tool calls and outputs) is kept in ``turns``: given those, ``replay_episodes`` regenerates the same
tokens from the same seeds without calling a tool.

Nothing is lost: an environment that raises ends its episode with finish reason "error" and the
message; an observation that no longer fits the token budget ends it with "length"; a wait for an
environment's answer has a deadline (``env.step_timeout_s``) and fails loudly past it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from rlax_core.data.records import routed_experts_bytes
from rlax_core.envs.base import Environment, EnvConfig, TurnResult, make_environment
from rlax_core.inference.config import SamplingParams


@dataclasses.dataclass(frozen=True)
class EpisodeStart:
    """One dataset row to run ``samples`` episodes of; ``prompt_id`` and ``seed`` fix their keys."""

    row: Mapping[str, Any]
    prompt_id: int | str
    seed: int = 0
    samples: int = 1


@dataclasses.dataclass
class Episode:
    """One finished episode: the transcript, its masks and versions, and what every turn returned."""

    prompt_id: int | str
    sample_index: int
    seed: int
    prompt_ids: list[int]
    completion_ids: list[int] = dataclasses.field(default_factory=list)  # turns and observations
    policy_mask: list[int] = dataclasses.field(default_factory=list)  # 1 at sampled tokens
    behavior_logprobs: list[float] = dataclasses.field(default_factory=list)  # 0 at observation tokens
    turn_versions: list[int] = dataclasses.field(default_factory=list)
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    finish_reason: str = ""  # the last turn's ("stop", "length"), or "length" (budget), "error"
    error: str = ""
    # A mixture of experts: the last turn's record, which covers the whole transcript [tokens, moe_layers, k].
    routed_experts: np.ndarray | None = None

    @property
    def reward(self) -> float:
        """The episode's return: the sum of its turns' rewards."""
        return float(sum(turn["reward"] for turn in self.turns))

    @property
    def policy_version(self) -> int:
        """The oldest turn's version: the staleness bound applies to it."""
        return min(self.turn_versions)

    def policy_token_ids(self) -> list[int]:
        return [t for t, m in zip(self.completion_ids, self.policy_mask) if m]

    def rollout_fields(self) -> dict[str, Any]:
        """Its fields of a Rollout row (``data.records``); the caller adds ids, group and reward info."""
        turns = [{key: value for key, value in turn.items() if key != "text"} for turn in self.turns]
        return {"seed": self.seed, "prompt_ids": list(self.prompt_ids), "completion_ids": list(self.completion_ids),
                "behavior_logprobs": list(self.behavior_logprobs), "policy_version": self.policy_version,
                "finish_reason": self.finish_reason, "reward": self.reward, "policy_mask": list(self.policy_mask),
                "turn_versions": list(self.turn_versions), "routed_experts": routed_experts_bytes(self.routed_experts),
                "episode": json.dumps({"turns": turns, "error": self.error}, sort_keys=True)}


@dataclasses.dataclass
class _Live:
    episode: Episode
    environment: Environment
    budget: int
    handle: int | None = None


def run_episodes(engine, tokenizer, config: EnvConfig, starts: Sequence[EpisodeStart], sampling: SamplingParams,
                 environment: Callable[[Mapping[str, Any], int], Environment] | None = None,
                 tool_pool: concurrent.futures.Executor | None = None) -> list[Episode]:
    """Run every start's episodes to their end on one ``Engine``; results in start order, then sample index.

    ``sampling`` gives temperature, top-k/p and stop settings; each turn's ``max_new_tokens`` is the
    smaller of ``config.max_turn_tokens`` and what the episode's budget has left. ``environment``
    (row, sample index) -> Environment overrides the config's (a replay passes ``RecordedEnvironment``
    ones). Over a replicated engine, ``rlax_core.rollout.host.EngineHost.run_episodes`` gives each
    replica its share of the starts.
    """
    from rlax_core.inference.sequences import Request

    make = environment or (lambda row, _: make_environment(config, row, tokenizer))
    budget = min(config.max_tokens, engine.config.max_seq_len)
    live: dict[tuple[Any, int], _Live] = {}
    order = []
    for start in starts:
        environments = [make(start.row, index) for index in range(start.samples)]
        text = environments[0].reset()
        for other in environments[1:]:
            other.reset()
        prompt_ids = list(tokenizer.encode(text, add_bos=environments[0].add_bos))
        first_turn = min(config.max_turn_tokens, budget - len(prompt_ids), engine.config.max_new_tokens)
        if first_turn < 1:
            raise ValueError(f"episode {start.prompt_id!r}: a prompt of {len(prompt_ids)} tokens leaves no room in "
                             f"the episode budget of {budget} tokens (env.max_tokens, engine max_seq_len)")
        for index, env in enumerate(environments):
            live[(start.prompt_id, index)] = _Live(Episode(start.prompt_id, index, start.seed, prompt_ids), env, budget)
            order.append((start.prompt_id, index))
        engine.add_request(Request(prompt_ids, _turn(sampling, environments[0], first_turn, start.samples),
                                   start.prompt_id, start.seed, episode_tokens=budget))
    own_pool = tool_pool is None
    pool = tool_pool or concurrent.futures.ThreadPoolExecutor(config.tool_workers, thread_name_prefix="env-tools")
    waiting: dict[concurrent.futures.Future, tuple[_Live, Any]] = {}  # the future of a turn's answer
    try:
        while engine.has_unfinished() or waiting:
            if engine.has_unfinished():
                for _, completion in engine.step():
                    state = live[(completion.prompt_id, completion.sample_index)]
                    _record_turn(state, completion, tokenizer)
                    future = pool.submit(state.environment.step, state.episode.turns[-1]["text"],
                                         completion.finish_reason)
                    waiting[future] = (state, completion)
            else:
                done, _ = concurrent.futures.wait(waiting, timeout=config.step_timeout_s, return_when="FIRST_COMPLETED")
                if not done:
                    raise TimeoutError(f"no environment answered within env.step_timeout_s={config.step_timeout_s:g} s "
                                       f"({len(waiting)} episodes waiting on their environment)")
            for future in [f for f in waiting if f.done()]:
                state, completion = waiting.pop(future)
                _answer(engine, tokenizer, config, sampling, state, completion, future)
    finally:
        if own_pool:
            pool.shutdown(wait=False, cancel_futures=True)
    for state in live.values():
        state.environment.close()
    return [live[key].episode for key in order]


def _turn(sampling: SamplingParams, env: Environment, max_new: int, samples_per_prompt: int = 1) -> SamplingParams:
    stops = tuple(dict.fromkeys((*sampling.stop_strings, *env.stop_strings)))
    return dataclasses.replace(sampling, max_new_tokens=max_new, samples_per_prompt=samples_per_prompt,
                               stop_strings=stops)


def _record_turn(state: _Live, completion, tokenizer) -> None:
    """Append the turn to the transcript."""
    episode = state.episode
    start = len(episode.completion_ids)
    episode.completion_ids += completion.completion_ids
    episode.policy_mask += [1] * len(completion.completion_ids)
    episode.behavior_logprobs += completion.logprobs
    episode.turn_versions.append(completion.weight_version)
    episode.routed_experts = completion.routed_experts  # the history's and this turn's: the transcript so far
    state.handle = completion.episode
    text = tokenizer.decode(list(completion.completion_ids), skip_special_tokens=True)
    episode.turns.append({"start": start, "end": len(episode.completion_ids), "version": completion.weight_version,
                          "finish_reason": completion.finish_reason, "text": text, "reward": 0.0,
                          "observation": "", "info": {}})
    episode.finish_reason = completion.finish_reason


def _answer(engine, tokenizer, config: EnvConfig, sampling: SamplingParams, state: _Live, completion,
            future: concurrent.futures.Future) -> None:
    """Apply the environment's answer: end the episode, or append the observation and queue the next turn."""
    episode, turn = state.episode, state.episode.turns[-1]
    try:
        result: TurnResult = future.result()
    except Exception as error:  # noqa: BLE001 - an environment's failure ends its episode, recorded
        episode.finish_reason, episode.error = "error", f"{type(error).__name__}: {error}"[:1000]
        engine.end_episode(state.handle)
        return
    turn.update(reward=float(result.reward), observation=result.observation, info=dict(result.info))
    if result.done or len(episode.turns) >= config.max_turns:  # the turn budget is the runner's to keep
        turn["observation"] = ""  # the episode ends without it
        engine.end_episode(state.handle)
        return
    observation = list(tokenizer.encode(result.observation, add_bos=False)) if result.observation else []
    used = len(episode.prompt_ids) + len(episode.completion_ids) + len(observation)
    room = min(config.max_turn_tokens, state.budget - used, engine.config.max_new_tokens)
    if room < 1:
        episode.finish_reason = "length"  # the observation does not fit: the episode ends without it
        turn["observation"] = ""
        engine.end_episode(state.handle)
        return
    episode.completion_ids += observation
    episode.policy_mask += [0] * len(observation)
    episode.behavior_logprobs += [0.0] * len(observation)
    engine.continue_episode(state.handle, observation, _turn(sampling, state.environment, room))


class RecordedEnvironment(Environment):
    """Answers with what an episode's turns returned before (``Episode.turns``): replays call no tool."""

    def __init__(self, prompt_text: str, turns: Sequence[Mapping[str, Any]], add_bos: bool = True,
                 stop_strings: tuple[str, ...] = ()):
        self.prompt_text, self.recorded, self.turn = prompt_text, list(turns), 0
        self.add_bos, self.stop_strings = add_bos, stop_strings

    def reset(self) -> str:
        return self.prompt_text

    def step(self, text: str, finish_reason: str = "stop") -> TurnResult:
        turn = self.recorded[self.turn]
        self.turn += 1
        done = self.turn == len(self.recorded)
        return TurnResult(observation=turn["observation"], reward=turn["reward"], done=done, info=turn["info"])
