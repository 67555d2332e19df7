"""Verifiable tasks shipped with RLAX: their prompts, rewards and task-specific metrics.

``reward_function(task, options)`` returns ``score(example, completion_text, finish_reason) ->
(reward, info)`` for a task name; ``info["pass"]`` is the verifiable outcome that pass@k counts.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from rlax_core.config import ConfigError, from_dict
from rlax_core.tasks import story

Score = Callable[[Mapping[str, Any], str, str], tuple[float, dict[str, Any]]]


def _story_reward(options: Mapping[str, Any]) -> Score:
    config = from_dict(story.StoryTaskConfig, dict(options), "task")

    def score(example: Mapping[str, Any], text: str, finish_reason: str) -> tuple[float, dict[str, Any]]:
        # The example may name its own target word (its answer); the config's is the default.
        word = example.get("answer") or config.target_word
        task_config = config if word == config.target_word else story.StoryTaskConfig(
            **{**story.dataclasses.asdict(config), "target_word": word})
        return story.score_story(text, finish_reason, task_config)

    return score


TASKS: dict[str, Callable[[Mapping[str, Any]], Score]] = {story.TASK: _story_reward}


def reward_function(task: str, options: Mapping[str, Any] | None = None) -> Score:
    if task not in TASKS:
        raise ConfigError("task", f"unknown task {task!r}; known: {', '.join(sorted(TASKS))}")
    return TASKS[task](options or {})
