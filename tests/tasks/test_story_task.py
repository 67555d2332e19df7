"""The quickstart's task: a reward that repetition cannot win, held-out prompts the schedule never sees."""

import pytest

from rlax_core.config import ConfigError
from rlax_core.rewards import RewardConfig, Rewarder
from rlax_core.tasks.story import (StoryTaskConfig, distinct_n, has_repeated_ngram, score_story, story_examples,
                                   story_prompts)

GOOD = "Tom went to the park with his mom and he was happy to see the big red ball.\n"


def test_one_paragraph_with_the_word_once_passes():
    reward, info = score_story(GOOD, "stop")
    assert info["pass"] and reward == 1.0


@pytest.mark.parametrize("text, finish, why", [
    ("Tom was happy, happy, so happy and happy all day in the sun with mom.\n", "stop", "target_count"),
    ("Tom went to the park and he was happy. Tom went to the park and he ran.\n", "stop", "repeated_ngram"),
    ("Tom went to the park with his mom and he was happy to see the big red ball", "length", "ended"),
    ("He was happy.\n", "stop", "words"),
    ("Tom went to the park with his mom and he saw a big red ball in the sun.\n", "stop", "target_count"),
])
def test_repetition_rambling_and_omission_fail(text, finish, why):
    reward, info = score_story(text, finish)
    assert not info["pass"] and reward < 1.0
    assert {"target_count": info["target_count"] != 1, "repeated_ngram": info["repeated_ngram"],
            "ended": not info["ended"], "words": info["words"] < 8}[why]


def test_saying_the_word_seven_times_scores_below_saying_it_once():
    hacked = " ".join(["Tom was happy."] * 7) + "\n"
    assert score_story(hacked, "stop")[0] < score_story(GOOD, "stop")[0]


def test_only_the_first_paragraph_counts():
    assert score_story(GOOD + "Then he was happy again and happy more.\n", "length")[1]["pass"]


def test_heldout_prompts_use_names_and_scenes_training_never_sees():
    train, heldout = set(story_prompts("train")), set(story_prompts("heldout"))
    assert not train & heldout
    assert not any("Mary" in p or "by the lake" in p for p in train)
    rows = story_examples("heldout", 16, seed=3)
    assert rows == story_examples("heldout", 16, seed=3) and {r["split"] for r in rows} == {"heldout"}


def test_the_reward_term_is_in_the_registry():
    with Rewarder(RewardConfig(terms={"story_word": 1.0})) as rewarder:
        reward, info = rewarder({"answer": "happy"}, GOOD, "stop")
        assert reward == 1.0 and info["pass"]
        reward, info = rewarder({"answer": "ball"}, GOOD, "stop")  # the example names its own word
        assert info["pass"]


def test_bad_config_names_the_field():
    with pytest.raises(ConfigError, match="target_word"):
        StoryTaskConfig(target_word="two words")


def test_fluency_helpers():
    assert has_repeated_ngram("a b c a b c".split(), 3) and not has_repeated_ngram("a b c d".split(), 3)
    assert distinct_n(["a b a b"], 1) == 0.5 and distinct_n([], 2) == 0.0
