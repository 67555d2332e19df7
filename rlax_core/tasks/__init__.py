"""Verifiable tasks shipped with RLAX: their prompts, reward terms and task-specific metrics.

Importing this package registers the tasks' reward terms in ``rlax_core.rewards`` (``story_word``),
so a ``RewardConfig`` can name them: ``rewards: {terms: {story_word: 1.0}}``.
"""

from rlax_core.tasks import story  # noqa: F401  (registers the story_word reward term)
