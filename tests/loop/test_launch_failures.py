"""A job that fails inside `rlax launch` reads as its cause: one line with the job's own exception
message and its log's path, no traceback from the launch (the job's log keeps its own)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.runners import cached_prism_binary
from rlax_core.tasks.story import story_examples, write_jsonl
from tests.support.tiny_launch import tiny_launch_overrides

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(cached_prism_binary() is None, reason="Prism not built: run `make setup`")]

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = tiny_launch_overrides(steps=2)


def test_a_trainer_failure_inside_launch_is_one_line_with_the_trainers_exception_message(tmp_path):
    import jax.numpy as jnp

    from rlax_core.training.checkpoint import Checkpointer
    from rlax_core.training.ledger import DataLedger

    train_set = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 8), train_set)
    output = tmp_path / "run"
    # The run folder holds a checkpoint of some other state: the trainer, resuming, cannot restore it.
    checkpointer = Checkpointer(output / "checkpoints", async_save=False)
    checkpointer.save(1, {"w": jnp.zeros(3)}, DataLedger())
    checkpointer.close()

    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "launch", "--config", "quickstart", "--resume",
                           "--train-set", str(train_set), "--output", str(output), "--timeout-s", "600", *OVERRIDES],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 1, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert not any("Traceback" in line for line in lines), done.stderr[-3000:]
    failures = [line for line in lines if line.startswith("rlax launch: ")]
    assert failures == [lines[-1]], lines[-5:]
    trainer_log = output / "logs" / "trainer.log"
    told = trainer_log.read_text()
    assert "Traceback (most recent call last)" in told  # the job's own log keeps it
    message = f"{output / 'checkpoints'}/1 holds another state than this trainer's"
    assert message in told
    assert lines[-1].startswith("rlax launch: error: the trainer job exited with code 2: input error: " + message)
    assert lines[-1].endswith(f"; its log: {trainer_log}")
