"""An episode's reward in the loop: its environment's return, plus the reward terms' verdict when asked."""

import json

import pytest

from rlax_core.envs.base import EnvConfig
from rlax_core.rewards.config import RewardConfig
from rlax_core.rewards.scorer import Rewarder
from rlax_core.rollout.samplers import EpisodeSampler, make_sampler
from rlax_core.tasks.story import story_examples
from tests.support.rollout_spec import rollout_spec


def score_group(rewarder, group, judge_answer):
    sampler = make_sampler(rollout_spec(env=EnvConfig(name="word_chain", tools=(), judge_answer=judge_answer)))
    assert isinstance(sampler, EpisodeSampler)  # loop.env chooses episodes
    return sampler.score(rewarder, group)


def _group():
    [example] = story_examples("train", 1, seed=0)
    turns = [{"start": 0, "end": 2, "reward": 0.25, "info": {"turn_pass": False}},
             {"start": 3, "end": 4, "reward": 1.0, "info": {"turn_pass": True, "pass": True}}]
    episode = {"example_id": example["id"], "group_id": "t/0/0", "sample_idx": 0, "policy_version": 2, "seed": 1,
               "prompt_ids": [1], "completion_ids": [5, 6, 7, 8], "behavior_logprobs": [-1.0, -1.0, 0.0, -1.0],
               "finish_reason": "stop", "reward": 1.25, "reward_info": None, "policy_mask": [1, 1, 0, 1],
               "turn_versions": [2, 3], "episode": json.dumps({"turns": turns, "error": ""})}
    text = "Lily was happy and she played with her big red ball all day long.\n"
    return {"key": (0, 0), "example": example, "rows": [episode], "texts": [text]}


@pytest.fixture(scope="module")
def rewarder():
    with Rewarder(RewardConfig(terms={"story_word": 1.0})) as rewarder:
        yield rewarder


def test_without_the_judge_the_turn_rewards_are_the_reward(rewarder):
    scored, failed = score_group(rewarder, _group(), judge_answer=False)
    [row] = scored["rows"]
    info = json.loads(row["reward_info"])
    assert (row["reward"], info["pass"], info["turn_rewards"], failed) == (1.25, True, [0.25, 1.0], 0)


def test_with_the_judge_its_score_adds_to_the_return(rewarder):
    group = _group()
    judged = rewarder(group["example"], group["texts"][0], "stop")
    [row] = score_group(rewarder, group, judge_answer=True)[0]["rows"]
    assert row["reward"] == pytest.approx(1.25 + judged.score)
    assert json.loads(row["reward_info"])["env_return"] == 1.25
