"""The loop's per-step metrics: the trainer's rows joined with the rollout side's, staleness counted."""

import json

import pytest

from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.rollout.loop_metrics import loop_metrics, write_loop_metrics
from rlax_core.utils import startup


def _group(store, key, versions):
    return [dict(example_id="ex", group_id=store.group_id(key), sample_idx=j, policy_version=v, seed=j,
                 prompt_ids=[5], completion_ids=[6, 7], behavior_logprobs=[-1.0, -1.0], finish_reason="stop",
                 reward=0.0, reward_info="{}") for j, v in enumerate(versions)]


def test_the_trainers_rows_meet_the_rollout_sides_by_step_with_staleness_and_idle_time(tmp_path):
    trainer_dir = tmp_path / "metrics"
    trainer_dir.mkdir()
    # The trainer logs optimizer step t + 1 after training on schedule step t's groups.
    rows = [{"step": 1, "time": 100.0, "train/wait_s": 3.0, "train/step_s": 1.0, "loss": 0.5},
            {"step": 2, "time": 104.5, "train/wait_s": 0.0, "train/step_s": 2.0, "loss": 0.4,
             "startup/trainer_process_t": 90.0}]
    (trainer_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    store = RolloutStore(tmp_path / "rollouts", run="r")
    store.write_group(GroupKey(0, 0), _group(store, GroupKey(0, 0), [0, 0]))
    store.write_group(GroupKey(1, 0), _group(store, GroupKey(1, 0), [0, 1]))  # one rollout a version behind
    store.write_step_metrics(0, {"step": 0, "reward_mean": 0.25})
    store.write_step_metrics(1, {"step": 1, "reward_mean": 0.75})

    joined = loop_metrics(str(trainer_dir), store, launch_stamps={"launch": 80.0})
    assert [row["step"] for row in joined] == [0, 1]
    first, second = joined
    assert (first["trainer/loss"], first["rollout/reward_mean"], first["staleness/0"]) == (0.5, 0.25, 2)
    assert first["loop/trainer_idle_fraction"] == pytest.approx(0.75) and "loop/step_wall_s" not in first
    assert (second["staleness/0"], second["staleness/1"], second["loop/step_wall_s"]) == (1, 1, 4.5)
    # Start-up stamps land on step 0: the trainer's and the launcher's.
    assert first[startup.key("trainer_process")] == 90.0 and first[startup.key("launch")] == 80.0
    assert not any(name.startswith("trainer/startup") for name in second)

    write_loop_metrics(joined, str(tmp_path / "loop"))
    written = [json.loads(line) for line in (tmp_path / "loop" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in written] == [0, 1] and written[1]["staleness/1"] == 1
