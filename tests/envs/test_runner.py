"""Episodes on the engine: transcripts, masks and versions; exact log-probs; replay; nothing lost."""

import dataclasses

import jax
import numpy as np
import pytest

from rlax_core.envs import EnvConfig, EpisodeStart, PythonToolConfig, RecordedEnvironment, run_episodes
from rlax_core.envs.base import Environment, TurnResult
from rlax_core.envs.tool_use import ToolUseEnvironment
from rlax_core.inference.config import SamplingParams
from rlax_core.sandbox.run import SandboxLimits
from rlax_core.tasks.story import story_examples
from tests.support.tolerances import assert_reordered_close, decoder_logprob_bound

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=24)
NEWLINE_STOP = dataclasses.replace(SAMPLING, stop_strings=("\n",))


def _word_chain(turns=3):
    return EnvConfig(name="word_chain", tools=(), max_turns=turns, max_turn_tokens=24, max_tokens=160)


def test_word_chain_episodes_have_exact_masks_versions_and_logprobs(engine, stories):
    model, tokenizer = stories
    rows = story_examples("train", 3, seed=1)
    starts = [EpisodeStart(row, prompt_id=i, seed=7, samples=2) for i, row in enumerate(rows)]
    episodes = run_episodes(engine, tokenizer, _word_chain(), starts, NEWLINE_STOP)
    assert [(e.prompt_id, e.sample_index) for e in episodes] == [(i, s) for i in range(3) for s in range(2)]
    assert engine.pages.num_free == engine.config.num_pages - 1 and engine.parked_episodes() == 0
    # The reference: one forward of every whole transcript, right-padded into one batch (one compile).
    transcripts = [e.prompt_ids + e.completion_ids for e in episodes]
    width = max(map(len, transcripts))
    padded = np.asarray([ids + [0] * (width - len(ids)) for ids in transcripts], np.int32)
    real = np.asarray([[1] * len(ids) + [0] * (width - len(ids)) for ids in transcripts], np.int32)
    all_logits = np.asarray(model(padded, real))
    for episode, ids, logits in zip(episodes, transcripts, all_logits):
        assert len(episode.turns) == 3 and episode.turn_versions == [0, 0, 0] and episode.policy_version == 0
        assert len(episode.completion_ids) == len(episode.policy_mask) == len(episode.behavior_logprobs)
        for turn, next_turn in zip(episode.turns, episode.turns[1:]):
            bridge = tokenizer.encode(turn["observation"], add_bos=False)
            assert episode.completion_ids[turn["end"]:next_turn["start"]] == bridge  # the observation, unsampled
            assert episode.policy_mask[turn["end"]:next_turn["start"]] == [0] * len(bridge)
        assert episode.reward == pytest.approx(sum(t["reward"] for t in episode.turns))
        # The policy's log-probs, with every later turn continuing from the cached prefix, equal a
        # single forward of the whole transcript.
        full = np.asarray(jax.nn.log_softmax(logits[:len(ids) - 1], axis=-1))[np.arange(len(ids) - 1), ids[1:]]
        at_policy = np.asarray(episode.policy_mask, bool)
        assert_reordered_close(np.asarray(episode.behavior_logprobs)[at_policy],
                               full[len(episode.prompt_ids) - 1:][at_policy],
                               decoder_logprob_bound(model.config, context=len(ids)))


def test_an_episode_replays_token_for_token_from_its_recorded_turns(engine, stories):
    _, tokenizer = stories
    rows = story_examples("heldout", 2, seed=3)
    starts = [EpisodeStart(row, prompt_id=f"p{i}", seed=11, samples=2) for i, row in enumerate(rows)]
    first = run_episodes(engine, tokenizer, _word_chain(), starts, NEWLINE_STOP)
    recorded = {(e.prompt_id, e.sample_index): e for e in first}

    def replay(row, sample_index):
        episode = recorded[(f"p{rows.index(row)}", sample_index)]
        return RecordedEnvironment(row["prompt"], episode.turns)

    again = run_episodes(engine, tokenizer, _word_chain(), starts, NEWLINE_STOP, environment=replay)
    assert [e.completion_ids for e in again] == [e.completion_ids for e in first]
    assert [e.reward for e in again] == [e.reward for e in first]


class ScriptedCalls(ToolUseEnvironment):
    """The real parser and tools, with a call appended to stories260K's text (it cannot write one)."""

    CALLS = {0: "<tool_call>{name: python}</tool_call>",
             1: '<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>',
             2: '<tool_call>{"name": "python", "arguments": {"code": "import os\\nos.abort()"}}</tool_call>'}

    def __init__(self, config, row, sample_index):
        super().__init__(config, row)
        self.sample_index = sample_index

    def reset(self):
        return self.row["prompt"]

    def step(self, text, finish_reason="stop"):
        if self.sample_index == 3:
            raise RuntimeError("the environment's own bug")
        return super().step(text + (self.CALLS[self.sample_index] if self.turn == 0 else ""), finish_reason)


def test_malformed_calls_timeouts_crashes_and_failing_environments_lose_no_episode(engine, stories):
    _, tokenizer = stories
    config = EnvConfig(name="tool_use", tools=("python",), max_turns=2, max_turn_tokens=16, max_tokens=256,
                       python=PythonToolConfig(limits=SandboxLimits(cpu_seconds=2, wall_seconds=2.0)))
    [row] = story_examples("train", 1, seed=5)
    episodes = run_episodes(engine, tokenizer, config, [EpisodeStart(row, "tools", seed=1, samples=4)], SAMPLING,
                            environment=lambda row, index: ScriptedCalls(config, row, index))
    assert len(episodes) == 4
    says = ["not valid JSON", "TimeoutError: the cell ran past 2 s", "the interpreter died"]
    for episode, expected in zip(episodes[:3], says):
        first, second = episode.turns
        assert expected in first["observation"] and first["info"]["calls"][0]["ok"] is False
        assert second["info"] == {"answered": True} and episode.finish_reason in ("stop", "length")
        assert sum(episode.policy_mask) == len(episode.completion_ids) - len(
            tokenizer.encode(first["observation"], add_bos=False))
    failed = episodes[3]
    assert failed.finish_reason == "error" and "the environment's own bug" in failed.error
    assert len(failed.turns) == 1 and failed.completion_ids  # its first turn is kept
    assert engine.pages.num_free == engine.config.num_pages - 1


class Chatty(Environment):
    """Answers every turn with an observation longer than the budget has room for."""

    def reset(self):
        return self.row["prompt"]

    def step(self, text, finish_reason="stop"):
        return TurnResult(observation=" and then" * 200, reward=1.0)


def test_an_observation_past_the_token_budget_ends_the_episode_with_length(engine, stories):
    _, tokenizer = stories
    config = _word_chain(turns=4)
    [row] = story_examples("train", 1, seed=2)
    [episode] = run_episodes(engine, tokenizer, config, [EpisodeStart(row, "long")], SAMPLING,
                             environment=lambda row, index: Chatty(config, row))
    assert episode.finish_reason == "length" and len(episode.turns) == 1 and episode.reward == 1.0
    assert all(episode.policy_mask)  # the observation that did not fit is not in the transcript
