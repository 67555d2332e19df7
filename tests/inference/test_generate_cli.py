"""`rlax generate` on the engine: sampling flags, prompts from a file, JSONL with log-probs."""

import json
from pathlib import Path

from pipelines.cli import main as rlax

STORIES = Path(__file__).resolve().parents[2] / "pipelines/assets/stories260K"


def _jsonl(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_sampled_jsonl_from_a_prompts_file_is_reproducible(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "dog", "prompt": "The dog"}\n{"id": "sun", "prompt": "The sun was"}\n')
    flags = ["generate", "--model", str(STORIES), "--prompts-file", str(prompts), "--max-new-tokens", "8",
             "--temperature", "0.9", "--top-p", "0.95", "--top-k", "50", "--n", "2", "--seed", "4",
             "--no-stop", "--format", "jsonl"]
    assert rlax([*flags, "--output", str(tmp_path / "a.jsonl")]) == 0
    assert rlax([*flags, "--output", str(tmp_path / "b.jsonl")]) == 0
    first, second = _jsonl(tmp_path / "a.jsonl"), _jsonl(tmp_path / "b.jsonl")
    assert first == second
    assert [(row["prompt_id"], row["sample_index"]) for row in first] == [("dog", 0), ("dog", 1), ("sun", 0), ("sun", 1)]
    for row in first:
        assert len(row["completion_ids"]) == len(row["logprobs"]) == 8 and row["finish_reason"] == "length"
        assert all(lp <= 0 for lp in row["logprobs"]) and row["seed"] == 4 and row["text"]
    # Two engine replicas (the tests' simulated devices) deal the prompts out and give the same samples.
    assert rlax([*flags, "--replicas", "2", "--output", str(tmp_path / "c.jsonl")]) == 0
    replicated = _jsonl(tmp_path / "c.jsonl")
    assert [row["completion_ids"] for row in replicated] == [row["completion_ids"] for row in first]
    assert [row["prompt_id"] for row in replicated] == [row["prompt_id"] for row in first]


def test_bad_sampling_options_fail_with_the_option_named(capsys):
    assert rlax(["generate", "--model", str(STORIES), "--top-p", "0"]) == 2
    assert "top_p" in capsys.readouterr().err
    assert rlax(["generate", "--model", str(STORIES), "--max-new-tokens", "0"]) == 2
    assert rlax(["generate", "--model", str(STORIES), "--replicas", "-1"]) == 2
    assert "--replicas" in capsys.readouterr().err
    assert rlax(["generate", "--model", str(STORIES), "--replicas", "999"]) == 2
    assert "engine.replicas=999 but this process has" in capsys.readouterr().err
