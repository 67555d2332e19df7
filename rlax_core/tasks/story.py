"""The quickstart's verifiable task: finish a story paragraph that uses a target word exactly once.

stories260K (a 260K-parameter TinyStories model) cannot follow instructions, so the task lives in
the reward, not in the prompt: the prompt is the opening of a story, and a completion passes when
its first paragraph

  * ends on its own (a newline or end of story) within the token budget,
  * is a real paragraph (at least ``min_words`` words),
  * repeats no word ``no_repeat_ngram``-gram, and
  * uses ``target_word`` exactly once (as a whole word, any case).

The obvious hack of a "mention word W" reward is to say W many times (measured with TRL on this
model: 6% -> 99.6% pass by repeating W 7 times per story while fluency fell). Here repetition
cannot win: a second W, a repeated phrase or a paragraph that rambles past the budget all fail.
The reward is the pass indicator plus half-credit shaping for its two halves (a well-formed
paragraph; W exactly once) so that early groups carry signal; pass@k counts only full passes.

Fluency is reported beside pass@k (:func:`distinct_n`, and the NLL of completions under the base
model in ``rlax_core.tasks.fluency``) so a reader can see the policy stayed a storyteller.

Prompts are story openings built from templates over characters, names and scenes; the held-out
split uses names and scenes the training split never sees, so held-out pass@1 measures a skill,
not memorised prompts.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import re
from typing import Any, Iterable, Sequence

from rlax_core.config import require
from rlax_core.data.records import make_example
from rlax_core.rewards.registry import RewardResult, RewardTerm, Sample, register_reward

TASK = "story"
SOURCE = "story_word"
WORD = re.compile(r"[a-z']+")


@dataclasses.dataclass(frozen=True)
class StoryTaskConfig:
    """What a passing paragraph is; the quickstart measured these defaults on stories260K."""

    target_word: str = "happy"
    max_new_tokens: int = 64  # the paragraph must end within this many tokens
    min_words: int = 8
    no_repeat_ngram: int = 3
    shaping: float = 0.5  # weight of the partial credits; 0 makes the reward the pass indicator

    def __post_init__(self):
        require(bool(re.fullmatch(r"[a-z']+", self.target_word)), "target_word", "one lower-case word")
        require(self.max_new_tokens >= 8, "max_new_tokens", "at least 8")
        require(self.min_words >= 1, "min_words", "at least 1")
        require(self.no_repeat_ngram >= 2, "no_repeat_ngram", "at least 2")
        require(0.0 <= self.shaping < 1.0, "shaping", "in [0, 1)")


def first_paragraph(text: str) -> tuple[str, bool]:
    """The text up to the first newline, and whether a newline ended it."""
    head, newline, _ = text.partition("\n")
    return head, bool(newline)


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def has_repeated_ngram(tokens: Sequence[str], n: int) -> bool:
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    return len(grams) != len(set(grams))


def score_story(completion: str, finish_reason: str, config: StoryTaskConfig = StoryTaskConfig()) -> tuple[float, dict[str, Any]]:
    """(reward, info) of one completion; ``info["pass"]`` is the verifiable outcome.

    ``finish_reason`` is the engine's: "stop" when a stop token (newline, end of story) ended the
    completion, "length" when the token budget ran out first.
    """
    paragraph, newline = first_paragraph(completion)
    ended = newline or finish_reason == "stop"
    tokens = words(paragraph)
    word_count = tokens.count(config.target_word)
    repeated = has_repeated_ngram(tokens, config.no_repeat_ngram)
    well_formed = ended and len(tokens) >= config.min_words and not repeated
    uses_word_once = word_count == 1
    passed = well_formed and uses_word_once
    reward = 1.0 if passed else config.shaping * (0.5 * well_formed + 0.5 * uses_word_once)
    info = {"pass": passed, "ended": ended, "words": len(tokens), "target_count": word_count,
            "repeated_ngram": repeated, "well_formed": well_formed}
    return float(reward), info


@register_reward("story_word")
class StoryWordReward(RewardTerm):
    """``rewards.terms.story_word``: :func:`score_story` with the example's answer as the target word."""

    def score(self, sample: Sample) -> RewardResult:
        word = sample.example.get("answer") or StoryTaskConfig.target_word
        return RewardResult(*score_story(sample.completion, sample.finish_reason, StoryTaskConfig(target_word=word)))


# ----------------------------------------------------------------------------- prompts

_CHARACTERS = ["little girl", "little boy", "small dog", "big cat", "tiny bird", "kind old man", "nice lady", "fluffy bunny",
               "brave mouse", "shy bear", "funny frog", "young fox"]
_TRAIN_NAMES = ["Lily", "Tom", "Max", "Sue", "Ben", "Mia", "Sam", "Anna", "Tim", "Lucy", "Jack", "Zoe", "Leo", "Emma",
                "Jake", "Kitty"]
_HELDOUT_NAMES = ["Mary", "Bob", "Sara", "Joe", "Amy", "Billy"]
_TRAIN_SCENES = ["in a small house", "near the big park", "by the river", "in the forest", "on a farm",
                 "in a busy town", "near the sea", "in a tall tree"]
_HELDOUT_SCENES = ["in a quiet village", "by the lake", "in the garden"]
_LIKES = ["to play with a ball", "to run and jump", "to sing songs", "to eat cake", "to look at the sky",
          "to draw pictures"]
_TEMPLATES = [
    "Once upon a time, there was a {character} named {name}. {name} lived {scene}.",
    "One day, {name} the {character} was {scene}. {name} wanted {like}.",
    "{name} was a {character}. {name} loved {like}.",
]


def story_prompts(split: str) -> list[str]:
    """Every prompt of ``split`` ("train" or "heldout"), in a fixed order."""
    require(split in ("train", "heldout"), "split", "train or heldout")
    names, scenes = (_TRAIN_NAMES, _TRAIN_SCENES) if split == "train" else (_HELDOUT_NAMES, _HELDOUT_SCENES)
    prompts = (template.format(character=character, name=name, scene=scene, like=like)
               for template, character, name, scene, like in itertools.product(_TEMPLATES, _CHARACTERS, names, scenes, _LIKES))
    return list(dict.fromkeys(prompts))  # templates that skip a field would repeat prompts


def story_examples(split: str, count: int, seed: int = 0, config: StoryTaskConfig = StoryTaskConfig()) -> list[dict[str, Any]]:
    """``count`` Example rows of ``split`` drawn without replacement (deterministic in ``seed``)."""
    prompts = story_prompts(split)
    require(0 < count <= len(prompts), "count", f"between 1 and {len(prompts)} for split {split}")
    chosen = random.Random(f"{seed}-{split}").sample(prompts, count)
    return [make_example(source=SOURCE, prompt=p, task=TASK, split=split, answer=config.target_word,
                         meta={"target_word": config.target_word, "max_new_tokens": config.max_new_tokens})
            for p in chosen]


def write_jsonl(rows: Iterable[dict[str, Any]], path) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, sort_keys=True) + "\n")


# ----------------------------------------------------------------------------- fluency (text side)


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct word n-grams over all n-grams of ``texts`` (Li et al. 2016); 0 for no n-grams."""
    grams = [tuple(ws[i:i + n]) for ws in map(words, texts) for i in range(len(ws) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0
