"""``word_chain``: a multi-turn story task stories260K can learn, rewarded per turn.

The episode opens with a story prompt (``tasks.story``); each turn the policy writes one paragraph,
and turn k passes when that paragraph uses the k-th word of ``options.words`` exactly once and is a
well-formed paragraph (``tasks.story.score_story``: ends within the budget, no repeated 3-gram). The
environment then starts the next paragraph with ``options.bridge`` ("The next day, " by default: the
turn ended at its newline)
and asks for the next word. stories260K cannot read instructions, so, as in the single-turn story
task, the request lives in the reward. The reward of a turn is its ``score_story`` reward; the
episode's return is their sum, and it passes when every turn passed. The episode has a turn per word;
the runner ends it sooner at ``max_turns``, and every turn reports whether the episode so far passes.
"""

from __future__ import annotations

from rlax_core.envs.base import Environment, TurnResult, register_environment
from rlax_core.tasks.story import StoryTaskConfig, score_story

DEFAULT_WORDS = ("happy", "ball", "tree")


@register_environment("word_chain")
class WordChain(Environment):

    def __init__(self, config, row, tokenizer=None):
        super().__init__(config, row, tokenizer)
        self.words = tuple(config.options.get("words", DEFAULT_WORDS))
        self.bridge = str(config.options.get("bridge", "The next day, "))
        self.passes: list[bool] = []

    def reset(self) -> str:
        return self.row["prompt"]

    def step(self, text: str, finish_reason: str = "stop") -> TurnResult:
        word = self.words[self.turn]
        self.turn += 1
        reward, info = score_story(text, finish_reason,
                                   StoryTaskConfig(target_word=word, max_new_tokens=self.config.max_turn_tokens))
        self.passes.append(bool(info["pass"]))
        done = self.turn >= len(self.words)
        # The episode passes when every turn did; its last turn, wherever it ends, says so (the loop's pass@k reads it).
        return TurnResult(observation="" if done else self.bridge, reward=reward, done=done,
                          info={"word": word, "turn_pass": bool(info["pass"]), "pass": all(self.passes)})
