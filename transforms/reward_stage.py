"""Where the rollouts are scored: fused with generation on the rollout worker, or on a stage of their own.

A reward model that does not fit beside the policy (``rewards.reward_model.placement: own_stage``)
is given its own stage: a Reshuffle ends the fused generation stage, and the scoring transform
carries the reward model's Beam resource hints (accelerator, min_ram, cpu_count), so a runner that
honours them (Dataflow's right fitting) runs it on such workers (docs/reward_models.md).
"""

from __future__ import annotations

import apache_beam as beam

from rlax_core.rewards.reward_model import scoring_stage_hints


class PlacedScoring(beam.PTransform):
    """``score`` (the rollout stream's ``ScoreRollouts``) applied where ``rewards`` places it.

    Args:
      score: the DoFn that scores a group.
      rewards: the run's ``RewardConfig``; its ``reward_model.placement`` and ``resource_hints`` decide.
    """

    def __init__(self, score: beam.DoFn, rewards):
        super().__init__()
        self._score, self._rewards = score, rewards

    def expand(self, groups):
        hints = scoring_stage_hints(self._rewards)
        if hints is not None:
            groups = groups | "ToRewardStage" >> beam.Reshuffle()
        return groups | "ScoreRollouts" >> beam.ParDo(self._score).with_resource_hints(**(hints or {}))
