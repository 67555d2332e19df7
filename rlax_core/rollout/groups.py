"""What the rollout stream does to a scored group before it is written, as ``algorithm:`` says.

    group = shape_overlong(algorithm, scored)       # ScoreRollouts: DAPO's overlong reward shaping
    if keeps_group(algorithm, group): ...            # AssembleGroups: DAPO's dynamic sampling

Overlong shaping (``algorithm.overlong_max_length`` > 0) adds ``rl.overlong_penalty`` of each
sample's length (its completion's tokens: an episode's turns and observations) to its reward, so the
rollout store holds the reward the trainer learns from; ``reward_info`` keeps the reward before it
(``task_reward``) and the penalty (``overlong_penalty``). Dynamic sampling
(``algorithm.dynamic_sampling``) drops a group whose task rewards are all equal
(``rl.dynamic_sampling``). These are the only readers of those keys: the ``dapo`` preset sets them.
"""

from __future__ import annotations

import json
from typing import Any

from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rl.dynamic_sampling import is_informative
from rlax_core.rl.reward_shaping import overlong_penalty


def shape_overlong(algorithm: AlgorithmConfig, group: dict[str, Any]) -> dict[str, Any]:
    """``group`` with DAPO's overlong penalty added to every reward (unchanged when shaping is off)."""
    rows = group["rows"]
    if algorithm.overlong_max_length <= 0 or not rows:
        return group
    penalties = overlong_penalty([len(row["completion_ids"]) for row in rows], algorithm.overlong_max_length,
                                 algorithm.overlong_cache_length, algorithm.overlong_penalty).tolist()
    out = []
    for row, penalty in zip(rows, penalties):
        info = {**json.loads(row["reward_info"]), "task_reward": row["reward"], "overlong_penalty": penalty}
        out.append({**row, "reward": row["reward"] + penalty, "reward_info": json.dumps(info, sort_keys=True)})
    return {**group, "rows": out}


def task_rewards(group: dict[str, Any]) -> list[float]:
    """Each sample's reward before overlong shaping."""
    return [float(json.loads(row["reward_info"]).get("task_reward", row["reward"])) for row in group["rows"]]


def keeps_group(algorithm: AlgorithmConfig, group: dict[str, Any]) -> bool:
    """Whether the group goes to the store: always, unless dynamic sampling finds it uninformative."""
    return not algorithm.dynamic_sampling or is_informative(task_rewards(group))
