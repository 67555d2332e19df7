"""The online loop end to end: trainer + streaming rollout pipeline as real processes on Prism.

Slow lane: each test starts both jobs (engine and trainer compile, Prism starts).
"""

import collections
import json
import os
import signal
import time
from pathlib import Path

import pytest

from pipelines.launch import launch, start
from pipelines.rl_stream import load_configs
from pipelines.runners import cached_prism_binary
from rlax_core.data.rollout_store import RolloutStore
from rlax_core.tasks.story import story_examples, write_jsonl
from rlax_core.utils.metrics import read_metrics
from rlax_core.utils.startup import HOPS as STARTUP_HOPS, startup_timeline
from rlax_core.utils.timeline import HOPS, step_timeline
from tests.support.tiny_launch import tiny_launch_overrides

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(cached_prism_binary() is None, reason="Prism not built: run `make setup`")]

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "quickstart.yaml")
STEPS, PROMPTS, SAMPLES = 4, 2, 2


def _overrides(tmp_path, k):
    return tiny_launch_overrides(tmp_path / "run", steps=STEPS, prompts=PROMPTS, samples=SAMPLES, max_staleness=k,
                                 checkpoint_every=1, wait_timeout_s=300, max_runtime_s=900)


def _train_set(tmp_path):
    path = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 16), path)
    return str(path)


def _groups_by_step(run_config):
    store = RolloutStore(run_config.rollout_root(), run_config.run.name)
    by_step = collections.defaultdict(dict)
    for key in store.list_groups():
        table = store.read_group(key)
        by_step[key.step][key.prompt_index] = table.to_pylist()
    return by_step


def _check_complete_run(run_config, k):
    """Every step trained once on exactly its groups; every rollout fresh enough for its step."""
    rows = read_metrics(Path(run_config.run.output_dir) / "metrics")
    last = {}
    for row in rows:  # a restarted trainer may log a step again only if it was not checkpointed
        last[row["step"]] = row
    assert sorted(last) == list(range(1, STEPS + 1))
    assert last[STEPS]["train/groups_consumed_total"] == STEPS * PROMPTS
    assert last[STEPS]["train/dropped_stale_total"] == 0  # so step t trained exactly schedule step t's groups
    by_step = _groups_by_step(run_config)
    for step in range(STEPS):
        groups = by_step[step]
        assert sorted(groups) == list(range(PROMPTS)), f"step {step} lost or duplicated a group: {sorted(groups)}"
        for rollouts in groups.values():
            assert sorted(r["sample_idx"] for r in rollouts) == list(range(SAMPLES))
            for rollout in rollouts:
                # trained at step `step` (optimizer step step + 1 after it): version within [step - k, step]
                assert step - k <= rollout["policy_version"] <= step


def test_synchronous_launch_trains_only_on_rollouts_of_the_current_version(tmp_path):
    overrides = _overrides(tmp_path, k=0)
    where = launch(CONFIG, overrides, [], train_set=_train_set(tmp_path), timeout_s=900)
    run_config, _ = load_configs(CONFIG, overrides)
    _check_complete_run(run_config, k=0)
    assert Path(where["metrics"]).exists()
    loop_rows = [json.loads(line) for line in Path(where["metrics"]).read_text().splitlines()]
    assert all(row.get("staleness/0") == PROMPTS * SAMPLES for row in loop_rows if row["step"] < STEPS)
    # The step timeline: both jobs' metrics carry their clocks, and they join into every hop of each step
    # (version 0 is published before the trainer's first metrics row: its publish hop is unknown).
    timeline = step_timeline(read_metrics(Path(run_config.run.output_dir) / "metrics"),
                             RolloutStore(run_config.rollout_root(), run_config.run.name).read_step_metrics())
    assert [(s["step"], s["version"]) for s in timeline] == [(step, step) for step in range(STEPS)]
    for s in timeline:
        missing = [hop for hop in HOPS if s[hop] is None and not (hop == "publish_s" and s["step"] == 0)]
        assert missing == [], f"step {s['step']}: no clocks for {missing}"
        assert all(s[hop] >= 0 for hop in ("schedule_s", "dispatch_s", "swap_s", "generate_s", "reward_s", "write_s"))
    _check_startup_stamps(loop_rows[0])


def _check_startup_stamps(row):
    """Step 0's loop row holds every start-up hop of the three processes, each after what it waits for."""
    assert row["step"] == 0
    timeline = startup_timeline(row)
    assert set(timeline) == set(STARTUP_HOPS)
    after = [("launch", "trainer_process"), ("trainer_process", "trainer_imports"), ("trainer_imports", "trainer_model"),
             ("trainer_model", "trainer_publish"), ("launch", "rollout_process"),
             ("rollout_process", "rollout_imports"), ("rollout_imports", "job_submitted"),
             ("prism_up", "job_submitted"), ("worker_start", "worker_model"), ("worker_model", "engine_compiled"),
             ("engine_compiled", "worker_first_weights"), ("trainer_publish", "worker_first_weights"),
             ("worker_first_weights", "worker_first_generated"), ("worker_first_generated", "trainer_first_read")]
    for before, hop in after:
        assert timeline[before] <= timeline[hop], f"{hop} stamped before {before}: {timeline}"


def _wait(condition, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.5)


def test_killed_rollout_pipeline_and_sigkilled_trainer_restart_and_the_run_completes(tmp_path):
    k = 1
    overrides = _overrides(tmp_path, k)
    train_set = _train_set(tmp_path)
    run_config, _ = load_configs(CONFIG, overrides)
    run_overrides = [o for o in overrides if not o.startswith("loop.")]
    logs = tmp_path / "logs"
    metrics_dir = Path(run_config.run.output_dir) / "metrics"
    store = RolloutStore(run_config.rollout_root(), run_config.run.name)
    trainer = start("trainer", ["train", "--config", CONFIG, *run_overrides], logs)
    rollout = start("rollout", ["rollout", "--config", CONFIG, "--train-set", train_set, *overrides], logs)
    try:
        # Kill the rollout pipeline as soon as it has written its first group, then start it again.
        _wait(lambda: store.list_groups(), 600, "no rollout group was written")
        os.killpg(rollout.popen.pid, signal.SIGKILL)
        rollout.popen.wait(timeout=30)
        rollout = start("rollout2", ["rollout", "--config", CONFIG, "--train-set", train_set, *overrides], logs)
        # SIGKILL the trainer once it has checkpointed step 2, then start it again: it must resume.
        _wait(lambda: any(r["step"] >= 2 for r in read_metrics(metrics_dir)), 600, "the trainer made no progress")
        os.killpg(trainer.popen.pid, signal.SIGKILL)
        trainer.popen.wait(timeout=30)
        trainer = start("trainer2", ["train", "--config", CONFIG, *run_overrides], logs)
        assert trainer.popen.wait(timeout=900) == 0, trainer.tail()
    finally:
        for process in (rollout, trainer):
            process.stop(10)
    assert "resumed from checkpoint" in (logs / "trainer2.log").read_text()
    _check_complete_run(run_config, k)
