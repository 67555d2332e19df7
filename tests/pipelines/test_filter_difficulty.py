"""`rlax filter` end to end: stories260K on the story task, and a toy Qwen2 with the real tokenizer on GSM8K test."""

import json

import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from rlax_core.tasks.story import story_examples, write_jsonl
from tests.eval.toy_models import toy_qwen2_checkpoint

STORIES = "pipelines/assets/stories260K"
SMALL_ENGINE = "generation.engine={num_slots: 8, max_prompt_len: 64, max_new_tokens: 48, prefill_buckets: [32, 64], num_pages: 64}"


def _read(out):
    stats = json.loads((out / "stats.json").read_text())
    kept = pq.ParquetDataset(sorted(out.glob("examples-*.parquet"))).read().to_pylist()
    rejected = [json.loads(line) for f in out.glob("rejected-*.jsonl") for line in f.read_text().splitlines()]
    return stats, kept, rejected


@pytest.mark.slow
def test_filter_stories260k_on_the_story_task(tmp_path):
    write_jsonl(story_examples("heldout", 8), tmp_path / "prompts.jsonl")
    out = tmp_path / "filtered"
    assert main(["filter", "--input", str(tmp_path / "prompts.jsonl"), "--model", STORIES, "--samples", "4",
                 "--low", "0.25", "--high", "1.0", "--output", str(out), "--runner", "FnApiRunner",
                 "--allow-empty",  # a band stories260K may not reach on 8 prompts: what is asserted is the partition
                 "generation.max_new_tokens=48", 'generation.stop_strings=["\\n"]', SMALL_ENGINE]) == 0
    stats, kept, rejected = _read(out)
    assert stats["prompts"] == 8 and stats["kept"] + stats["too_hard"] + stats["too_easy"] == 8
    assert stats["kept"] == len(kept) and all(0.25 <= row["pass_rate"] <= 1.0 for row in kept)
    assert all(row["n_samples"] == 4 and row["filter_model_version"] == "stories260K" for row in kept)
    assert all(r["reason"] == "too_hard" and r["pass_rate"] < 0.25 for r in rejected)
    assert (out / "pass_rate_histogram.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_filter_toy_qwen2_with_real_tokenizer_on_gsm8k_test(tmp_path, data_dir):
    model = toy_qwen2_checkpoint(tmp_path / "toy_qwen2", data_dir)
    out = tmp_path / "filtered"
    assert main(["filter", "--input", str(data_dir / "gsm8k/test.jsonl"), "--model", str(model), "--samples", "2",
                 "--limit", "4", "--low", "0.0", "--high", "1.0", "--output", str(out), "--runner", "FnApiRunner",
                 "generation.max_new_tokens=8",
                 "generation.engine={num_slots: 8, max_prompt_len: 256, max_new_tokens: 16, prefill_buckets: [128, 256], num_pages: 160}"]) == 0
    stats, kept, rejected = _read(out)
    assert stats["prompts"] == 4 and stats["unreadable"] == 0 and stats["skipped"] == 0
    assert stats["kept"] == 4 and all(row["source"] == "gsm8k" and row["n_samples"] == 2 for row in kept)
