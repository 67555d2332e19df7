"""``rlax dpo`` from the command line, as docs/post_training.md gives it: a short run on story pairs
writes the preference metrics and the held-out NLL, and a Hugging Face export; the pairs it holds out
are whole prompts (``pipelines.sft.split_pairs``)."""

import json
import signal
from pathlib import Path

import pytest

from pipelines.cli import main

NAMES = ["Lily", "Tom", "Max", "Sue", "Ben", "Mia", "Sam", "Zoe", "Leo", "Amy"]
# Three pairs per prompt, as `rlax rft` writes them: one prompt's pairs share its text.
PAIRS = [{"id": f"{name}-{k}", "prompt": f"Once upon a time, {name}",
          "chosen": f" {name} found a ball and was happy{'!' * k}", "rejected": f" {name} {name} {name}{'.' * k}"}
         for name in NAMES for k in range(3)]


@pytest.mark.slow  # one DPO job of 3 steps on stories260K (its compile is most of it)
def test_rlax_dpo_trains_on_pairs_reports_rewards_and_held_out_nll_and_exports(tmp_path):
    from rlax_core.training.post_config import DpoConfig
    from pipelines.sft import split_pairs

    data, out = tmp_path / "pairs.jsonl", tmp_path / "run"
    data.write_text("".join(json.dumps(pair) + "\n" for pair in PAIRS))
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main(["dpo", "--config", "quickstart", f"dpo.data={data}", "dpo.beta=0.1", "dpo.pairs_per_step=4",
                     "dpo.validation_fraction=0.3", "trainer.total_steps=3", "trainer.checkpoint_every=3",
                     "trainer.async_checkpointing=false", f"run.output_dir={out}"])
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert code == 0
    train, held_out = split_pairs(DpoConfig(data=str(data), validation_fraction=0.3))
    assert held_out and {p["prompt"] for p in train}.isdisjoint(p["prompt"] for p in held_out)
    rows = [json.loads(line) for line in Path(out / "metrics" / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in rows if "train/rewards_accuracy" in row]
    assert [row["step"] for row in steps] == [1, 2, 3]
    assert all({"train/rewards_chosen", "train/rewards_rejected", "train/rewards_margin"} <= row.keys() for row in steps)
    assert any("train/heldout_nll" in row for row in rows)
    assert any(row.get("data/pairs") == len(train) for row in rows)
    assert (out / "hf" / "step_00000003" / "model.safetensors").is_file()
