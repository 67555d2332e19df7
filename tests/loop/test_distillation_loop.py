"""On-policy distillation in the online loop: ``rlax launch`` of the quickstart recipe with a teacher
(stories260K at temperature 0.5) scoring the student's own samples token by token, and nothing else
to learn from (the story verifier at weight 0). The student's per-token reverse KL to the teacher,
logged every step as ``rollout/distill_reverse_kl``, falls over the run.

Slow lane: both jobs start (engine and trainer compile, Prism starts).
"""

import json
from pathlib import Path

import numpy as np
import pytest

from pipelines.launch import launch
from pipelines.runners import cached_prism_binary
from rlax_core.tasks.story import story_examples, write_jsonl
from tests.rewards.test_distillation import sharpened_teacher
from tests.support.tiny_launch import tiny_launch_overrides

pytestmark = [pytest.mark.slow, pytest.mark.long,
              pytest.mark.skipif(cached_prism_binary() is None, reason="Prism not built: run `make setup`")]

REPO = Path(__file__).resolve().parents[2]
STEPS = 12


def test_the_students_reverse_kl_to_the_teacher_falls_over_the_run(tmp_path):
    teacher = sharpened_teacher(tmp_path / "teacher")
    train_set = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 64), train_set)
    # 8 prompts x 8 samples of 32 tokens a step, at the quickstart's learning rate: with 4 x 4 samples of
    # 24 tokens the per-token estimate is too noisy for a few steps to show (the KL wandered upwards).
    overrides = [*tiny_launch_overrides(tmp_path / "run", steps=STEPS, prompts=8, samples=8, max_staleness=0,
                                        max_new_tokens=32, max_seq_len=96, wait_timeout_s=900, max_runtime_s=2400,
                                        stall_polls=900),
                 "engine.num_slots=64", "loop.rewards.terms={story_word: 0.0}",
                 f"loop.rewards.distillation.teacher={teacher}"]
    where = launch(str(REPO / "configs" / "quickstart.yaml"), overrides, [], train_set=str(train_set), timeout_s=2400)
    rows = {row["step"]: row for row in map(json.loads, Path(where["metrics"]).read_text().splitlines())}
    kl = [rows[step]["rollout/distill_reverse_kl"] for step in range(STEPS)]
    print("distill_reverse_kl by step:", [round(k, 4) for k in kl])
    trained = [rows[step]["trainer/train/token_reward_mean"] for step in range(STEPS)
               if "trainer/train/token_reward_mean" in rows[step]]
    assert trained, "the trainer's metrics hold the token rewards it learnt from"
    assert kl[0] > 0.1  # the teacher is not the student: there is something to learn
    first, last = np.mean(kl[:3]), np.mean(kl[-3:])
    assert last < 0.8 * first, f"reverse KL {first:.4f} -> {last:.4f} over {STEPS} steps: {kl}"
