"""Claims on steps hold across processes (and, through the store, across VMs): one owner per step at a
time, released or expired for every process at once, renewed while the step is generated."""

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlax_core.rollout.claims import StepClaims, claim_lifetime_s
from tests.support.rollout_spec import rollout_spec

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("gcs_emulator").make_bucket() + "/store"


def test_one_owner_at_a_time_and_a_release_frees_the_step_at_once(root):
    mine, theirs = StepClaims(root, lifetime_s=30), StepClaims(root, lifetime_s=30)
    assert mine.try_claim("r", 0) and not theirs.try_claim("r", 0) and theirs.held("r", 0)
    assert theirs.try_claim("r", 1)  # another step: another owner
    mine.release("r", 0)
    assert not theirs.held("r", 0) and theirs.try_claim("r", 0) and not mine.try_claim("r", 0)
    assert StepClaims(root, lifetime_s=30, job="next").try_claim("r", 0)  # a restarted job has its own claims


def test_an_expired_claim_is_taken_over_and_a_renewed_one_is_not(root):
    short = StepClaims(root, lifetime_s=0.5)
    assert short.try_claim("r", 0) and short.try_claim("r", 1)
    time.sleep(0.3)
    assert short.renew("r", 1)  # live another 0.5 s from now
    time.sleep(0.3)
    other = StepClaims(root, lifetime_s=0.5)
    late = "token of step 0's first claim"
    taken_over = other.try_claim("r", 0)  # step 0's claim is 0.6 s old: expired
    assert taken_over and not other.try_claim("r", 1)  # step 1's was renewed 0.3 s ago
    # A worker late with step 0 neither frees nor prolongs the claim that replaced its own.
    short.release("r", 0, late)
    assert not short.renew("r", 0, late) and other.held("r", 0)
    assert other.renew("r", 0, taken_over)
    short.release("r", 1)
    assert not short.renew("r", 1)  # a released claim is not brought back by a late renewal


def test_a_claims_lifetime_follows_the_recipes_expected_step_time(tmp_path):
    spec = rollout_spec(tmp_path, expected_step_s=1800.0)
    assert spec.claims().lifetime_s == claim_lifetime_s(1800.0) == 3600.0


# Claims live CLAIM_S; a step is generated for STEP_S, more than twice that. Seconds, not fractions of one:
# renewals go through the GCS emulator, and a loaded CI host delays a call by most of a second.
CLAIM_S, STEP_S = 4.0, 9.0

WORKER = textwrap.dedent(f"""
    import contextlib, json, os, sys, time
    from pathlib import Path
    from rlax_core.data.rollout_store import GroupKey
    from rlax_core.rollout.pacing import StepPacer
    from tests.support.rollout_spec import rollout_spec

    root, events, name, mode = sys.argv[1:5]
    spec = rollout_spec(root, run="claims", groups_per_step=2, total_steps=2, max_staleness=1,
                        expected_step_s={CLAIM_S / 2})  # claims live CLAIM_S
    scheduler, claims, store = StepPacer(spec), spec.claims(), spec.store()

    def event(what, step=None):
        with open(events, "a") as log:
            log.write(json.dumps({{"worker": name, "what": what, "step": step, "t": time.time()}}) + "\\n")

    deferring = mode == "defer"
    deadline = time.time() + 120
    while time.time() < deadline and not all(store.is_step_complete(s, 2, store.list_groups()) for s in range(2)):
        taken = {{unit.step: unit.claim for unit in scheduler.units(0)}}  # version 0 allows steps 0 and 1
        steps = sorted(taken)
        event("tick")
        for step in steps:
            event("claimed", step)
        if deferring and steps:  # holds them until the go, then defers them (weights too old): a release
            with claims.keep(spec.run, list(taken.items())):
                while not Path(events + ".go").exists():
                    time.sleep(0.01)
            for step in steps:
                claims.release(spec.run, step, taken[step])
                event("released", step)
            deferring = False
            # Busy with other work until the other worker has taken every released step (it may take
            # one only after generating another): from then on it is an ordinary fleet worker again.
            def taken_by_the_other():
                seen = [json.loads(line) for line in Path(events).read_text().splitlines()]
                return {{e["step"] for e in seen if e["worker"] != name and e["what"] == "claimed"}} >= set(steps)
            wait_until = time.time() + 120
            while not taken_by_the_other() and time.time() < wait_until:
                time.sleep(0.05)
            continue
        # As GenerateRollouts does with a bundle's units: their steps' claims are renewed while it works.
        keep = claims.keep(spec.run, list(taken.items())) if mode != "no_renewal" else contextlib.nullcontext()
        with keep:
            for step in steps:
                event("start", step)
                time.sleep({STEP_S})  # a step that outlives its claim more than twice over
                for slot in range(2):
                    rows = [dict(example_id="e", group_id=store.group_id(GroupKey(step, slot)), sample_idx=0,
                                 policy_version=0, seed=0, prompt_ids=[1], completion_ids=[2],
                                 behavior_logprobs=[-1.0], finish_reason="stop", reward=1.0, reward_info="{{}}")]
                    store.write_group(GroupKey(step, slot), rows)
                store.mark_step_generated(step)
                event("end", step)
                claims.release(spec.run, step)  # as MarkStepGenerated does
        time.sleep(0.05)
""")


def _events(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()] if Path(path).exists() else []


def _wait_for(path, test, what, workers, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while not test(_events(path)):
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {_events(path)[-5:]}"
        assert all(w.poll() is None for w in workers), f"a worker exited while waiting for {what}"
        time.sleep(0.05)


def _two_workers(root, tmp_path, second_mode):
    """Worker a claims both steps, then defers them (a release) once worker b is ticking; b generates."""
    events = str(tmp_path / "events.jsonl")
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def start(name, mode):
        return subprocess.Popen([sys.executable, "-c", WORKER, root, events, name, mode], env=env)

    a = start("a", "defer")
    workers = [a]
    try:
        _wait_for(events, lambda e: sum(x["what"] == "claimed" for x in e) == 2, "a to claim both steps", workers)
        workers.append(start("b", second_mode))
        _wait_for(events, lambda e: any(x["worker"] == "b" and x["what"] == "tick" for x in e), "b to tick", workers)
        Path(events + ".go").touch()
        for worker in workers:
            assert worker.wait(timeout=180) == 0
    finally:
        for worker in workers:
            worker.kill()
    return _events(events)


@pytest.mark.slow  # two processes, each step generated for STEP_S
def test_two_workers_never_generate_a_step_twice_and_a_released_step_moves_at_once(root, tmp_path):
    events = _two_workers(root, tmp_path, "renew")
    starts = [e for e in events if e["what"] == "start"]
    assert sorted(e["step"] for e in starts) == [0, 1] and {e["worker"] for e in starts} == {"b"}, [  # once each
        (e["worker"], e["what"], e["step"], round(e["t"] - events[0]["t"], 2)) for e in events if e["what"] != "tick"]
    # The first step released moves at once, not after its claim's lifetime (b takes the other at its
    # next tick, which may come after it generated the first).
    released = min(e["t"] for e in events if e["what"] == "released")
    taken = min(e["t"] for e in events if e["what"] == "claimed" and e["worker"] == "b")
    assert 0 <= taken - released < CLAIM_S / 2
    for step in (0, 1):
        start, end = (next(e["t"] for e in events if e["what"] == what and e["step"] == step) for what in ("start", "end"))
        assert end - start > 2 * CLAIM_S  # generated for longer than twice its claim's lifetime, and never twice


@pytest.mark.slow
def test_without_renewal_a_step_that_outlives_its_claim_is_generated_twice(root, tmp_path):
    # The control: the same run with claims left to expire while their step is generated.
    events = _two_workers(root, tmp_path, "no_renewal")
    starts = [e["step"] for e in events if e["what"] == "start"]
    assert len(starts) > len(set(starts))
