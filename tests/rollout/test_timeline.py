"""The loop's step timeline: the trainer's and the rollout stream's wall clocks joined into hops."""

import pytest

from rlax_core.utils.timeline import HOPS, median_hops, step_timeline
from rlax_core.rollout.metrics import step_timeline_clocks


def _trainer_row(step, *, wait_start, read, publish, commit):
    return {"step": step, "train/step_s": 0.5, "train/wait_s": read - wait_start, "timeline/wait_start_t": wait_start,
            "timeline/read_t": read, "timeline/publish_t": publish, "timeline/commit_version": commit[0],
            "timeline/commit_t": commit[1]}


def _rollout_step(step, version, t0):
    """Schedule step ``step``'s clocks, generated with ``version`` committed at ``t0``."""
    return {"step": step, "timeline/scheduled_version": version, "timeline/version_seen_t": t0 + 0.25,
            "timeline/scheduled_t": t0 + 0.5, "timeline/generate_call_t": t0 + 1.0, "timeline/swap_s": 0.125,
            "timeline/generated_t": t0 + 2.125, "timeline/scored_t": t0 + 2.375, "timeline/written_t": t0 + 2.5,
            "timeline/marked_t": t0 + 2.625}


def test_synchronous_steps_join_into_every_hop():
    # version 1: submitted at 100, committed at 100.5; its step (k = 0: step 1) is read by trainer row 2
    trainer = [_trainer_row(1, wait_start=90.0, read=95.0, publish=100.0, commit=(0, 80.0)),
               _trainer_row(2, wait_start=100.0, read=103.5, publish=104.0, commit=(1, 100.5))]
    rollout = [_rollout_step(1, 1, 100.5)]
    (step,) = step_timeline(trainer, rollout)
    assert step["step"] == 1 and step["version"] == 1
    assert step["publish_s"] == 0.5
    assert step["side_input_s"] == 0.25
    assert step["schedule_s"] == 0.25
    assert step["dispatch_s"] == 0.5
    assert step["swap_s"] == 0.125
    assert step["generate_s"] == 1.0
    assert step["reward_s"] == 0.25
    assert step["write_s"] == 0.125
    assert step["read_s"] == 0.5  # written at 103.0, trainer waiting since 100: read at 103.5
    assert step["commit_to_read_s"] == 3.0
    assert step["train_s"] == 0.5 and step["wait_s"] == 3.5
    assert step["after_train_s"] is None  # no row 3 yet: its wait has not started


def test_after_the_update_runs_to_the_next_wait():
    rows = [_trainer_row(2, wait_start=100.0, read=103.5, publish=104.0, commit=(1, 100.5)),
            _trainer_row(3, wait_start=104.25, read=105.0, publish=106.0, commit=(2, 104.5))]
    (step,) = step_timeline(rows, [_rollout_step(1, 1, 100.5)])
    assert step["after_train_s"] == 0.25  # read at 103.5, trained for 0.5 s, waiting again at 104.25


def test_the_read_hop_starts_when_the_trainer_is_ready_if_the_groups_were_there_first():
    # k = 1: step 2 (allowed by version 1) is written while the trainer still trains step 1
    trainer = [_trainer_row(2, wait_start=100.0, read=100.1, publish=101.0, commit=(1, 100.0)),
               _trainer_row(3, wait_start=104.0, read=104.25, publish=105.0, commit=(2, 101.5))]
    (step,) = step_timeline(trainer, [_rollout_step(2, 1, 100.0)])
    assert step["read_s"] == 0.25  # groups written at 102.5, trainer ready at 104


def test_hops_whose_clocks_are_missing_are_none_not_guessed():
    # version 0 is published before the first metrics row: its publish hop is unknown; no consumer row yet
    (step,) = step_timeline([], [_rollout_step(0, 0, 50.0)])
    assert step["publish_s"] is None and step["side_input_s"] is None and step["read_s"] is None
    assert step["generate_s"] == 1.0
    assert step_timeline([], [{"step": 3, "reward_mean": 0.5}]) == []  # recorded before the timeline existed


def test_median_hops_covers_every_hop_and_skips_missing_values():
    timeline = [{"publish_s": 1.0, "read_s": None}, {"publish_s": 3.0, "read_s": 2.0}, {"publish_s": 2.0}]
    medians = median_hops(timeline)
    assert set(HOPS) <= set(medians)
    assert medians["publish_s"] == 2.0 and medians["read_s"] == 2.0 and medians["swap_s"] is None


def test_a_steps_clocks_start_with_its_first_group_and_end_with_its_last():
    groups = [{"scheduled_version": 3, "version_seen_t": 1.0, "scheduled_t": 2.0, "generate_call_t": 3.0,
               "swap_s": 0.0, "swap_version": 3, "generated_t": 5.0, "scored_t": 6.0, "written_t": 7.0},
              {"scheduled_version": 3, "version_seen_t": 1.0, "scheduled_t": 2.0, "generate_call_t": 4.0,
               "swap_s": 0.5, "swap_version": 4, "generated_t": 8.0, "scored_t": 9.0}]  # the second was dropped
    clocks = step_timeline_clocks(groups)
    assert clocks == {"timeline/scheduled_version": 3, "timeline/swap_version": 4, "timeline/version_seen_t": 1.0,
                      "timeline/scheduled_t": 2.0, "timeline/generate_call_t": 3.0, "timeline/swap_s": 0.5,
                      "timeline/generated_t": 8.0, "timeline/scored_t": 9.0, "timeline/written_t": 7.0}


@pytest.mark.parametrize("missing", ["timeline/read_t", "timeline/wait_start_t"])
def test_a_consumer_row_without_its_clocks_leaves_the_read_hop_unknown(missing):
    row = _trainer_row(2, wait_start=100.0, read=103.5, publish=104.0, commit=(1, 100.5))
    del row[missing]
    (step,) = step_timeline([row], [_rollout_step(1, 1, 100.5)])
    assert step["read_s"] is None


def test_groups_without_clocks_give_a_step_without_timeline_metrics():
    # A group made outside GenerateRollouts (a test, a replayed store) carries no clocks.
    assert step_timeline_clocks([{}, {"scored_t": 4.0}]) == {"timeline/scored_t": 4.0}
