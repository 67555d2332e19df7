"""The online loop with multi-turn episodes: trainer + streaming rollout pipeline on Prism.

Slow lane: both jobs start (engine and trainer compile, Prism starts). Each sample is a word_chain
episode of two turns on stories260K; the trainer learns from their policy tokens only.
"""

import collections
import json
from pathlib import Path

import pytest

from pipelines.launch import launch
from pipelines.rl_stream import load_configs
from pipelines.runners import cached_prism_binary
from rlax_core.data.rollout_store import RolloutStore
from rlax_core.tasks.story import story_examples, write_jsonl
from rlax_core.utils.metrics import read_metrics
from tests.support.tiny_launch import tiny_launch_overrides

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(cached_prism_binary() is None, reason="Prism not built: run `make setup`")]

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
STEPS, PROMPTS, SAMPLES, TURNS = 3, 2, 2, 2


def test_the_streaming_loop_trains_on_episodes_every_group_once_with_per_turn_versions(tmp_path):
    train_set = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 16), train_set)
    overrides = [*tiny_launch_overrides(tmp_path / "run", steps=STEPS, prompts=PROMPTS, samples=SAMPLES, max_staleness=1,
                                        max_new_tokens=32, max_seq_len=96, checkpoint_every=1, wait_timeout_s=300,
                                        max_runtime_s=900),
                 "loop.env.name=word_chain", "loop.env.tools=[]",
                 f"loop.env.max_turns={TURNS}", "loop.env.max_turn_tokens=12", "loop.env.max_tokens=96",
                 "loop.env.judge_answer=false"]
    launch(CONFIG, overrides, [], train_set=str(train_set), timeout_s=900)
    run_config, _ = load_configs(CONFIG, overrides)
    metrics = {row["step"]: row for row in read_metrics(Path(run_config.run.output_dir) / "metrics")}
    assert sorted(metrics) == list(range(1, STEPS + 1))
    assert metrics[STEPS]["train/groups_consumed_total"] == STEPS * PROMPTS
    store = RolloutStore(run_config.rollout_root(), run_config.run.name)
    by_step = collections.defaultdict(list)
    for key in store.list_groups():
        by_step[key.step].append(key.prompt_index)
    assert {step: sorted(slots) for step, slots in by_step.items()} == {s: list(range(PROMPTS)) for s in range(STEPS)}
    for key in store.list_groups():
        rows = store.read_group(key).to_pylist()
        assert sorted(r["sample_idx"] for r in rows) == list(range(SAMPLES))
        for row in rows:
            turns = json.loads(row["episode"])["turns"]
            assert len(row["turn_versions"]) == len(turns) >= 1
            assert row["policy_version"] == min(row["turn_versions"])
            assert len(row["policy_mask"]) == len(row["completion_ids"]) == len(row["behavior_logprobs"])
            assert sum(row["policy_mask"]) == sum(t["end"] - t["start"] for t in turns)
            assert row["reward"] == pytest.approx(sum(t["reward"] for t in turns))
