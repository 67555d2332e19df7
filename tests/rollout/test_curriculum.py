"""``loop.curriculum``: the kinds, the registry, and the state the draws read (docs/curriculum.md).

The state is folded from a real ``RolloutStore`` holding groups written as the stream writes them
(``WriteGroups``, ``RecordDropped``, ``MarkStepGenerated``'s marker); only their rows are made here.
"""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from rlax_core.config import ConfigError
from rlax_core.data.rollout_store import GroupKey
from rlax_core.rollout.curriculum import CURRICULA, CurriculumConfig, make_curriculum, register_curriculum
from rlax_core.rollout.drawing import StepDraws
from rlax_core.rollout.prompt_state import CurriculumState, GroupScore, PromptTable
from rlax_core.rollout.schedule import prompt_indices
from tests.support.rollout_spec import rollout_spec

REPO = Path(__file__).resolve().parents[2]
N = 12  # prompts
EXAMPLES = tuple({"id": f"p{i}", "pass_rate": (i % 4) / 4 if i < 8 else None, "n_samples": 4 if i < 8 else None}
                 for i in range(N))


def _spec(tmp_path, **curriculum):
    return rollout_spec(tmp_path, run="c", groups_per_step=3, total_steps=20, max_staleness=1,
                        curriculum=CurriculumConfig(**curriculum))


def _rows(store, step, slot, example_id, passes, version=0):
    key = GroupKey(step, slot)
    return key, [{"example_id": example_id, "group_id": store.group_id(key), "sample_idx": i, "policy_version": version,
                  "seed": 0, "prompt_ids": [1], "completion_ids": [2, 3], "behavior_logprobs": [0.0, 0.0],
                  "finish_reason": "stop", "reward": float(p), "reward_info": json.dumps({"pass": bool(p)})}
                 for i, p in enumerate(passes)]


def _write_step(spec, draws, step, outcomes, *, complete=True, dropped=()):
    """Step ``step``'s groups as the stream leaves them: written, dropped (scores recorded), then the marker."""
    store = spec.store()
    for slot, row in enumerate(draws.rows(step)):
        if slot >= len(outcomes):
            break
        key, rows = _rows(store, step, slot, EXAMPLES[row]["id"], outcomes[slot], version=step)
        if slot in dropped:
            store.write_dropped_scores(key, {"slot": slot, "example_id": EXAMPLES[row]["id"], "samples": len(rows),
                                             "passes": sum(outcomes[slot]), "policy_version": step})
        else:
            store.write_group(key, rows)
    if complete and dropped:
        store.mark_step_generated(step)


def test_uniform_by_default_draws_exactly_today_s_schedule(tmp_path):
    draws = StepDraws(_spec(tmp_path), EXAMPLES)
    assert not draws.curriculum.reads_state  # reads no store: no step needs to be complete first
    for step in range(40):
        assert draws.rows(step) == prompt_indices(0, step, N, 3)
    assert not (tmp_path / "rollouts").exists()


def test_the_registry_refuses_a_taken_name_and_configs_ask_it():
    with pytest.raises(ValueError, match="curriculum 'balanced' is already registered"):
        register_curriculum("balanced")(lambda prompts, step, seed, count: [0] * count)
    assert {"uniform", "difficulty_pools", "balanced"} <= set(CURRICULA)
    with pytest.raises(ConfigError, match="kind"):
        CurriculumConfig(kind="adarft")


def _table(rates, **kw):
    state = CurriculumState({f"p{i}": _state(r) for i, r in enumerate(rates)})
    return PromptTable.of(state, [{"id": f"p{i}"} for i in range(len(rates))], 10, **kw)


def _state(rate):
    from rlax_core.rollout.prompt_state import PromptState
    return PromptState() if rate is None else PromptState(samples=8, passes=round(rate * 8), latest=rate, ema=rate)


def _frequencies(kind, rates, draws=400, **settings):
    curriculum = make_curriculum(CurriculumConfig(kind=kind, **settings))
    table = _table(rates)
    counts = np.zeros(len(rates))
    for step in range(draws):
        for row in curriculum.draw(table, step, 0, 2):
            counts[row] += 1
    return counts / counts.sum()


def test_balanced_draws_prompts_near_half_most_and_difficulty_pools_weights_its_pools():
    rates = [0.0, 0.5, 1.0, 0.5, 0.1, None]
    balanced = _frequencies("balanced", rates)
    assert balanced[1] > 3 * balanced[0] and balanced[3] > 3 * balanced[2] and balanced[5] > 3 * balanced[4] / 2
    pools = _frequencies("difficulty_pools", rates)
    assert pools[1] > 2.5 * pools[0] and pools[1] > 2.5 * pools[2] and pools[5] > 2.5 * pools[4]
    table = _table(rates)
    assert make_curriculum(CurriculumConfig(kind="difficulty_pools")).pools(table) == {
        "eligible": 6, "hard": 2, "normal": 2, "easy": 1, "unseen": 1}


def test_retired_and_resting_prompts_are_not_drawn_while_others_remain():
    from rlax_core.rollout.prompt_state import PromptState

    state = CurriculumState({"solved": PromptState(8, 8, 1.0, 1.0, 9, 9, solved_draws=2),
                             "failing": PromptState(8, 0, 0.0, 0.0, 8, 8, failed_streak=8),
                             "fresh": PromptState(), "mid": PromptState(8, 4, 0.5, 0.5, 7, 7)})
    examples = [{"id": k} for k in ("solved", "failing", "fresh", "mid")]
    table = PromptTable.of(state, examples, 10, retire_after_solved=2, rest_after_failed=8, rest_steps=4)
    assert table.retired.tolist() == [True, False, False, False] and table.resting.tolist() == [False, True, False, False]
    for kind in ("uniform", "balanced", "difficulty_pools"):
        curriculum = make_curriculum(CurriculumConfig(kind=kind, retire_after_solved=2, rest_after_failed=8))
        assert all(set(curriculum.draw(table, s, 0, 2)) == {2, 3} for s in range(20)), kind
    later = PromptTable.of(state, examples, 13, retire_after_solved=2, rest_after_failed=8, rest_steps=4)
    assert not later.resting[1]  # rested rest_steps steps after its last draw (step 8): back at step 13


def test_a_step_s_pass_rate_is_divided_by_completed_groups_only(tmp_path):
    spec = _spec(tmp_path, kind="balanced")  # k = 1: step s reads steps <= s - 2
    draws = StepDraws(spec, EXAMPLES, wait_s=0.2)
    rows0 = draws.rows(0)
    _write_step(spec, draws, 0, [[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dropped=(1, 2))  # 2 dropped, still count
    # Step 1 is in flight: one group written of three, no marker. Its scores must not enter.
    in_flight_row = draws.rows(1)[0]
    _write_step(spec, draws, 1, [[1, 1, 1, 1]], complete=False)
    state = draws.state_for(2)
    assert state.next_step == 1
    seeded = CurriculumState.seeded(EXAMPLES)  # the filter's pass rates seed it; p8.. have none: unseen
    assert (seeded.prompts["p1"].samples, seeded.prompts["p1"].passes, seeded.prompts["p1"].ema) == (4, 1, 0.25)
    assert seeded.prompts["p9"].ema is None and seeded.prompts["p9"].samples == 0
    for slot, (row, passes) in enumerate(zip(rows0, (1, 4, 0))):
        prompt, before = state.prompts[EXAMPLES[row]["id"]], seeded.prompts[EXAMPLES[row]["id"]]
        assert (prompt.samples - before.samples, prompt.passes - before.passes) == (4, passes)
        assert prompt.latest == passes / 4 and prompt.last_step == 0
    if in_flight_row not in rows0:
        assert state.prompts[EXAMPLES[in_flight_row]["id"]] == seeded.prompts[EXAMPLES[in_flight_row]["id"]]
    # Drawing step 3 needs step 1 complete: it waits, then refuses, and never folds part of a step.
    with pytest.raises(TimeoutError, match="step 1 is not complete"):
        StepDraws(spec, EXAMPLES, wait_s=0.2).rows(3)


def _run(spec, steps):
    """Steps 0..steps-1 as a loop would leave them (``_continue``) by a fresh process."""
    return _continue(spec, StepDraws(spec, EXAMPLES), 0, steps)


def test_a_restarted_job_draws_the_same_prompts_and_resumes_the_same_state(tmp_path):
    whole = _run(_spec(tmp_path / "whole", kind="balanced", retire_after_solved=2), 8)
    # Interrupted after step 4: a new process (a replacement rollout job, or --resume) continues.
    spec = _spec(tmp_path / "resumed", kind="balanced", retire_after_solved=2)
    first = _run(spec, 5)
    restarted = StepDraws(spec, EXAMPLES)
    assert [restarted.rows(s) for s in range(5)] == [first.rows(s) for s in range(5)]  # replay of written steps
    resumed = _continue(spec, restarted, 5, 8)
    assert [resumed.rows(s) for s in range(9)] == [whole.rows(s) for s in range(9)]
    assert resumed.state_for(8).to_json() == whole.state_for(8).to_json()
    saved = sorted(p.name for p in (tmp_path / "resumed" / "rollouts" / "c-metrics" / "curriculum").iterdir())
    assert saved[-1] == "state_step_00000007.json"
    # A process that starts from scratch (no saved state) folds to the same state.
    fresh_spec = _spec(tmp_path / "fresh", kind="balanced", retire_after_solved=2)
    _run(fresh_spec, 8)
    assert StepDraws(fresh_spec, EXAMPLES).state_for(8).to_json() == whole.state_for(8).to_json()
    assert len({tuple(whole.rows(s)) for s in range(8)}) > 1


def _continue(spec, draws, start, stop):
    """Steps start..stop-1: each drawn, then its groups written (a sample passes by a fixed rule of its
    prompt, the step and its index, so that the state changes step by step); uniform groups dropped."""
    for step in range(start, stop):
        outcomes = [[int((int(EXAMPLES[r]["id"][1:]) + step + i) % 3 == 0) for i in range(4)] for r in draws.rows(step)]
        _write_step(spec, draws, step, outcomes, dropped=tuple(s for s, o in enumerate(outcomes) if len(set(o)) == 1))
    return draws


def test_metrics_hold_pools_draw_pass_rate_retired_resting_and_dropped_share(tmp_path):
    draws = _run(_spec(tmp_path, kind="difficulty_pools", retire_after_solved=1, rest_after_failed=4), 6)
    metrics = draws.metrics(6, dropped=1, groups=3)
    assert metrics["curriculum/dropped_group_share"] == pytest.approx(1 / 3)
    assert {"curriculum/pool/eligible", "curriculum/pool/hard", "curriculum/pool/normal", "curriculum/pool/easy",
            "curriculum/pool/unseen", "curriculum/retired", "curriculum/resting", "curriculum/draw_pass_rate"} <= set(metrics)
    assert metrics["curriculum/pool/eligible"] + metrics["curriculum/retired"] + metrics["curriculum/resting"] >= N
    assert 0 <= metrics["curriculum/draw_pass_rate"] <= 1


def test_the_state_exports_as_a_table_the_filter_s_columns_read(tmp_path):
    from rlax_core.data.training_set import cached_examples  # noqa: F401  (the reader of the columns)
    from rlax_core.rollout.prompt_state import export_table

    draws = _run(_spec(tmp_path, kind="balanced"), 4)
    path = export_table(draws.state_for(4), tmp_path / "pass_rates.parquet")
    table = pq.read_table(path).to_pylist()
    assert [row["id"] for row in table] == sorted(e["id"] for e in EXAMPLES)
    assert all(row["pass_rate"] is None or 0 <= row["pass_rate"] <= 1 for row in table)
    assert {"id", "pass_rate", "n_samples", "ema", "last_step"} <= set(table[0])
    # The next run's curriculum reads it (loop.curriculum.seed_from): its state starts from these rates.
    after = _spec(tmp_path / "next", kind="balanced", seed_from=str(path))
    seeded = StepDraws(after, EXAMPLES).state_for(0).prompts
    assert {k: (v.samples, v.ema) for k, v in seeded.items()} == {
        row["id"]: (row["n_samples"], row["pass_rate"]) for row in table}
    with pytest.raises(ConfigError, match="seed_from: no such file"):
        CurriculumConfig(seed_from=str(tmp_path / "missing.parquet"))


def test_a_user_function_is_a_kind_and_its_rows_are_checked(tmp_path):
    module = tmp_path / "my_curriculum.py"
    module.write_text(textwrap.dedent("""
        from rlax_core.rollout.curriculum import register_curriculum

        @register_curriculum("test_first_rows")
        def first_rows(prompts, step, seed, count):
            return list(range(count)) if step < 5 else [999] * count
    """))
    config = CurriculumConfig(kind="test_first_rows", modules=(str(module),))
    curriculum = make_curriculum(config)
    table = _table([0.5] * 6)
    assert curriculum.draw(table, 1, 0, 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="must return 3 rows in 0..5"):
        curriculum.draw(table, 7, 0, 3)


def test_a_bad_curriculum_module_is_refused_when_the_run_s_config_loads(tmp_path):
    from pipelines.config import load_run_config

    bad = tmp_path / "bad_curriculum.py"
    bad.write_text("raise RuntimeError('this curriculum is broken')\n")
    with pytest.raises(ConfigError) as refused:
        load_run_config("quickstart", [f"loop.curriculum.modules=[{bad}]"])
    assert str(refused.value) == (f"loop.curriculum.modules[0]: curriculum file {bad}: RuntimeError: "
                                  "this curriculum is broken")


@pytest.mark.slow  # about 10 s: a fresh `rlax` process imports JAX and Beam
def test_a_bad_curriculum_module_is_refused_at_start_up_with_one_line(tmp_path):
    from rlax_core.tasks.story import story_examples, write_jsonl

    bad = tmp_path / "bad_curriculum.py"
    bad.write_text("raise RuntimeError('this curriculum is broken')\n")
    train = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 4), train)
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "launch", "--config", str(REPO / "configs/quickstart.yaml"),
                           "--train-set", str(train), f"run.output_dir={tmp_path / 'run'}",
                           f"loop.curriculum.modules=[{bad}]"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert lines == [f"rlax launch: config error: loop.curriculum.modules[0]: curriculum file {bad}: "
                     "RuntimeError: this curriculum is broken"], done.stderr
