"""Placement of a reward model's scoring: fused with generation on the rollout worker (the default), or
its own stage behind a Reshuffle carrying Beam resource hints (``rewards.reward_model.placement``)."""

import apache_beam as beam
import pytest

from rlax_core.config import ConfigError
from rlax_core.rewards.config import RewardConfig
from rlax_core.rewards.reward_model import RewardModelConfig
from tests.support.rollout_spec import rollout_spec
from transforms.rollout import RolloutStream


def _applied(rewards: RewardConfig) -> dict:
    pipeline = beam.Pipeline()
    ticks = pipeline | "Ticks" >> beam.Create([0])
    latest = pipeline | "Latest" >> beam.Create([0])
    _ = (ticks, latest) | RolloutStream(rollout_spec(rewards=rewards))
    found = {}

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            found[node.full_label.rsplit("/", 1)[-1]] = node

        def enter_composite_transform(self, node):
            self.visit_transform(node)

    pipeline.visit(Visitor())
    return found


def test_scoring_is_fused_with_generation_by_default():
    applied = _applied(RewardConfig(terms={"story_word": 1.0}))
    assert "ScoreRollouts" in applied and "ToRewardStage" not in applied
    assert not applied["ScoreRollouts"].resource_hints


def test_a_reward_model_on_its_own_stage_carries_its_resource_hints():
    settings = RewardModelConfig(path="rm/", placement="own_stage",
                                 resource_hints={"min_ram": "64GB", "accelerator": "type:nvidia-l4;count:1"})
    applied = _applied(RewardConfig(terms={"reward_model": 1.0}, reward_model=settings))
    assert "ToRewardStage" in applied
    hints = applied["ScoreRollouts"].resource_hints
    assert hints["beam:resources:min_ram_bytes:v1"] == b"64000000000"
    assert hints["beam:resources:accelerator:v1"] == b"type:nvidia-l4;count:1"


def test_unknown_hints_and_hints_on_the_rollout_worker_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"resource_hints: unknown hint\(s\) \['gpu'\]"):
        RewardModelConfig(path="rm/", placement="own_stage", resource_hints={"gpu": "1"})
    with pytest.raises(ConfigError, match="resource_hints: apply to placement: own_stage"):
        RewardModelConfig(path="rm/", resource_hints={"min_ram": "8GB"})
