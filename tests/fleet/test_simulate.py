"""The fleet simulator's invariants: analytic cases, fractions in [0, 1], staleness within k, physical bounds."""

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from rlax_core.fleet.compiled import bound_by
from rlax_core.fleet.simulate import FleetParams, analytic_one_worker_synchronous, simulate

BASE = FleetParams(workers=1, max_staleness=0, groups_per_step=8, seconds_per_token=1e-4, tokens_per_group=512,
                   trainer_step_s=0.15, weight_sync_s=0.2, steps=30, warmup_steps=5)


@pytest.mark.parametrize("groups_per_call", [1, 3, 8])
def test_one_synchronous_worker_matches_the_analytic_cycle(groups_per_call):
    params = dataclasses.replace(BASE, groups_per_call=groups_per_call, call_overhead_s=0.01)
    result = simulate(params)
    assert result.groups_per_s == pytest.approx(analytic_one_worker_synchronous(params), rel=1e-9)
    assert result.staleness == {0: (params.steps - params.warmup_steps) * params.groups_per_step}


def test_a_worker_per_group_makes_a_synchronous_step_one_group_long():
    params = dataclasses.replace(BASE, workers=BASE.groups_per_step)
    cycle = BASE.seconds_per_group + BASE.trainer_step_s + BASE.weight_sync_s
    assert simulate(params).groups_per_s == pytest.approx(BASE.groups_per_step / cycle, rel=1e-9)


def test_staleness_lets_the_fleet_generate_while_the_trainer_trains():
    fleet = dataclasses.replace(BASE, workers=8)
    synchronous, one_ahead = simulate(fleet), simulate(dataclasses.replace(fleet, max_staleness=1))
    assert one_ahead.groups_per_s > synchronous.groups_per_s
    assert one_ahead.trainer_idle_fraction < synchronous.trainer_idle_fraction


@settings(max_examples=60, deadline=None)
@given(workers=st.integers(1, 64), k=st.integers(0, 3), groups=st.integers(1, 24), per_unit=st.integers(1, 5),
       per_call=st.integers(1, 16), token_s=st.floats(1e-6, 1e-3), trainer_s=st.floats(0, 2), sync_s=st.floats(0, 1))
def test_fractions_staleness_and_throughput_stay_within_their_bounds(workers, k, groups, per_unit, per_call, token_s,
                                                                      trainer_s, sync_s):
    params = FleetParams(workers=workers, max_staleness=k, groups_per_step=groups, seconds_per_token=token_s,
                         tokens_per_group=256, trainer_step_s=trainer_s, weight_sync_s=sync_s,
                         groups_per_unit=per_unit, groups_per_call=per_call, steps=12, warmup_steps=3)
    result = simulate(params)
    assert 0.0 <= result.trainer_idle_fraction <= 1.0 + 1e-9
    assert 0.0 <= result.worker_busy_fraction <= 1.0 + 1e-9
    assert all(0 <= lag <= k for lag in result.staleness)
    assert sum(result.staleness.values()) == (params.steps - params.warmup_steps) * groups
    # No faster than the fleet generating flat out (plus what it generated ahead before the measured
    # steps began: at most k + 1 steps, and each worker's call in flight), nor than the trainer trains.
    span = result.seconds_per_step * (params.steps - params.warmup_steps)
    ahead = (k + 1) * groups + workers * (per_call + per_unit)
    assert result.groups_per_s * span <= workers * span / params.seconds_per_group + ahead + 1e-6
    if trainer_s > 0:
        assert result.groups_per_s <= groups / trainer_s * (1 + 1e-9)


@pytest.mark.parametrize("field, value", [("workers", 0), ("max_staleness", -1), ("groups_per_unit", 0),
                                          ("trainer_step_s", -1.0), ("warmup_steps", 30)])
def test_out_of_range_settings_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(BASE, **{field: value})


STREAM = dataclasses.replace(BASE, seconds_per_token=0.0, tokens_per_group=4 * 100, group_overhead_s=0.01,
                             decode_step_s=lambda n: 0.01 + 0.001 * n, samples_per_group=4, sequences_per_worker=64)


def test_one_streaming_engine_runs_a_step_as_one_batch_of_its_running_sequences():
    """k = 0, one worker whose engine holds the whole step: its 8 groups' prefills, then 100 steps of
    32 sequences at 0.01 + 0.001 x 32 s each, then the trainer's step and the sync."""
    result = simulate(STREAM)
    cycle = 8 * 0.01 + 100 * (0.01 + 0.001 * 32) + BASE.trainer_step_s + BASE.weight_sync_s
    assert result.groups_per_s == pytest.approx(8 / cycle, rel=1e-9)
    assert result.staleness == {0: (STREAM.steps - STREAM.warmup_steps) * 8}


def test_a_streaming_engine_admits_no_more_sequences_than_it_holds():
    """8 sequences per engine: two 4-sample groups at a time, so a step is four rounds of 100 steps of 8."""
    result = simulate(dataclasses.replace(STREAM, sequences_per_worker=8, group_overhead_s=0.0))
    cycle = 4 * 100 * (0.01 + 0.001 * 8) + BASE.trainer_step_s + BASE.weight_sync_s
    assert result.groups_per_s == pytest.approx(8 / cycle, rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(workers=st.integers(1, 24), k=st.integers(0, 2), groups=st.integers(1, 16), per_unit=st.integers(1, 4),
       samples=st.integers(1, 8), slots=st.integers(1, 64), fixed=st.floats(1e-4, 1e-2), trainer_s=st.floats(0, 2))
def test_streaming_fleets_stay_within_their_bounds(workers, k, groups, per_unit, samples, slots, fixed, trainer_s):
    params = dataclasses.replace(STREAM, workers=workers, max_staleness=k, groups_per_step=groups, groups_per_unit=per_unit,
                                 samples_per_group=samples, tokens_per_group=samples * 50, sequences_per_worker=slots,
                                 decode_step_s=lambda n: fixed + 1e-4 * n, trainer_step_s=trainer_s, steps=12,
                                 warmup_steps=3)
    result = simulate(params)
    assert 0.0 <= result.trainer_idle_fraction <= 1.0 + 1e-9
    assert 0.0 <= result.worker_busy_fraction <= 1.0 + 1e-9
    assert all(0 <= lag <= k for lag in result.staleness)
    assert sum(result.staleness.values()) == (params.steps - params.warmup_steps) * groups
    # No faster than every engine full, flat out (plus what was generated before the measured steps:
    # at most k + 1 steps and what the engines held).
    span = result.seconds_per_step * (params.steps - params.warmup_steps)
    full = max(slots, per_unit * samples)  # an empty engine admits one unit whatever its size
    groups_per_s = workers * full / samples / (50 * (fixed + 1e-4 * full))
    ahead = (k + 1) * groups + workers * (full // samples + per_unit)
    assert sum(result.staleness.values()) <= span * groups_per_s + ahead + 1e-6


# A scoring stage of its own (a reward model on chips of its own, between rollout and trainer),
# hand-counted: 1-second groups, a 1-second trainer step, no weight sync.
HAND = FleetParams(workers=1, max_staleness=0, groups_per_step=2, seconds_per_token=1.0, tokens_per_group=1,
                   trainer_step_s=1.0, weight_sync_s=0.0, steps=20, warmup_steps=4)


def test_a_scoring_stage_adds_its_latency_to_a_synchronous_step():
    # Without it: generate 2 groups (2 s), train (1 s): 3 s. With one scorer at 0.5 s a group, the
    # first group is scored while the second is generated and the second after it: 2 + 0.5 + 1 = 3.5 s.
    plain = simulate(HAND)
    scored = simulate(dataclasses.replace(HAND, scoring_servers=1, scoring_s_per_group=0.5))
    assert plain.seconds_per_step == pytest.approx(3.0, rel=1e-9)
    assert scored.seconds_per_step == pytest.approx(3.5, rel=1e-9)
    assert scored.scoring_busy_fraction == pytest.approx(1.0 / 3.5, rel=1e-9)  # 2 x 0.5 s of each 3.5 s
    assert bound_by(scored) == bound_by(plain) == "latency"  # the stages take turns: none is saturated


def test_a_scoring_stage_slower_than_the_others_is_the_step():
    # Two workers and k = 1 generate a step in 1 s and the trainer trains it in 1 s; one scorer at 2 s
    # a group needs 2 x 2 = 4 s a step and is never idle: the step is the stage's 4 s.
    fleet = dataclasses.replace(HAND, workers=2, max_staleness=1)
    plain = simulate(fleet)
    scored = simulate(dataclasses.replace(fleet, scoring_servers=1, scoring_s_per_group=2.0))
    assert scored.seconds_per_step == pytest.approx(2 * 2.0 / 1, rel=1e-9)
    assert scored.seconds_per_step >= plain.seconds_per_step and plain.seconds_per_step == pytest.approx(1.0)
    # Busy throughout the 16 measured steps (64 s) but the last one's training (no step follows it).
    assert scored.scoring_busy_fraction == pytest.approx(1 - 1.0 / 64, rel=1e-9)
    assert bound_by(scored) == "scoring"
    # Two scorers halve it; the stage still bounds the step (2 s against the others' 1 s).
    two = simulate(dataclasses.replace(fleet, scoring_servers=2, scoring_s_per_group=2.0))
    assert two.seconds_per_step == pytest.approx(2.0, rel=1e-9)
