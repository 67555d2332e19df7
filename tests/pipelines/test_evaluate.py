"""`rlax evaluate` end to end: two checkpoints side by side on the story task; a toy Qwen2 on GSM8K test."""

import json

import pytest

from pipelines.cli import main
from rlax_core.tasks.story import story_examples, write_jsonl
from tests.eval.toy_models import toy_qwen2_checkpoint

STORIES = "pipelines/assets/stories260K"


@pytest.mark.slow
def test_evaluate_two_checkpoints_side_by_side_on_stories(tmp_path):
    write_jsonl(story_examples("heldout", 6), tmp_path / "heldout.jsonl")
    out = tmp_path / "eval"
    # the same weights twice (folder and .bin file): the two columns must agree sample for sample
    assert main(["evaluate", "--model", STORIES, "--model", f"{STORIES}/stories260K.bin",
                 "--eval-set", str(tmp_path / "heldout.jsonl"), "--samples", "4", "--output", str(out),
                 "--runner", "FnApiRunner", "model_names=[folder, bin]", "ks=[1, 2, 4]",
                 "generation.max_new_tokens=48", 'generation.stop_strings=["\\n"]',
                 "generation.engine={num_slots: 8, max_prompt_len: 64, max_new_tokens: 48, prefill_buckets: [32, 64], num_pages: 64}"]) == 0
    report = json.loads((out / "report.json").read_text())
    folder, binary = (report["models"][m]["story_word"]["overall"] for m in ("folder", "bin"))
    assert folder == binary and folder["prompts"] == 6 and folder["samples"] == 24
    assert 0.0 <= folder["pass@1"] <= folder["pass@2"] <= folder["pass@4"] <= 1.0
    assert "maj@1" not in folder  # the story task has no answer to vote on
    samples = [json.loads(line) for f in out.glob("samples-*.jsonl") for line in f.read_text().splitlines()]
    assert len(samples) == 12 and all(len(s["texts"]) == 4 for s in samples)
    markdown = (out / "report.md").read_text()
    assert "| story_word | folder | 6 |" in markdown and "| story_word | bin | 6 |" in markdown
    assert all((out / name).read_bytes()[:4] == b"\x89PNG" for name in ("pass_at_k.png", "lengths.png"))


@pytest.mark.slow
def test_evaluate_toy_qwen2_on_gsm8k_and_math500(tmp_path, data_dir):
    model = toy_qwen2_checkpoint(tmp_path / "toy_qwen2", data_dir)
    out = tmp_path / "eval"
    assert main(["evaluate", "--model", str(model), "--eval-set", str(data_dir / "gsm8k/test.jsonl"),
                 "--eval-set", str(data_dir / "math/math500_test.jsonl"), "--samples", "2", "--limit", "3",
                 "--output", str(out), "--runner", "FnApiRunner", "ks=[1, 2]",
                 "generation.max_new_tokens=8",
                 "generation.engine={num_slots: 8, max_prompt_len: 512, max_new_tokens: 16, prefill_buckets: [128, 256, 512], num_pages: 300}"]) == 0
    report = json.loads((out / "report.json").read_text())
    per_set = report["models"]["toy_qwen2"]
    assert sorted(per_set) == ["gsm8k/test", "math/math500_test"]
    assert per_set["gsm8k/test"]["overall"]["prompts"] == 3
    assert per_set["math/math500_test"]["by_subject"] and per_set["math/math500_test"]["by_level"]
    assert all(n <= 8 for n in per_set["gsm8k/test"]["lengths"])


HELDOUT = "pipelines/assets/story_task/heldout.jsonl"
SMALL_ENGINE = ("generation.engine={num_slots: 4, max_prompt_len: 64, max_new_tokens: 16, prefill_buckets: [64], "
                "num_pages: 32}")


def test_the_bundled_heldout_prompts_are_an_eval_set():
    from rlax_core.data.formats import to_example

    rows = [to_example("auto", json.loads(line)) for line in open(HELDOUT, encoding="utf-8")]
    assert len(rows) == 64 and {(r["task"], r["source"], r["split"]) for r in rows} == {("story", "story_heldout", "heldout")}
    assert all(r["answer"] and r["prompt"] for r in rows)


@pytest.mark.parametrize("name, text, says", [
    ("empty", "", "no usable rows (the set is empty)"),
    ("wrong", '{"question_text": "2+2?"}\n{"foo": 1}\n', "no usable rows (2 unknown_format; rejected rows in"),
])
def test_an_eval_set_without_usable_rows_is_one_line_and_a_non_zero_exit(tmp_path, capsys, name, text, says):
    path = tmp_path / f"{name}.jsonl"
    path.write_text(text)
    code = main(["evaluate", "--model", STORIES, "--eval-set", str(path), "--output", str(tmp_path / "eval"),
                 "--runner", "FnApiRunner", "--samples", "1", "generation.max_new_tokens=4", SMALL_ENGINE])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code != 0 and error.startswith(f"rlax evaluate: input error: eval set {path}: ") and says in error


@pytest.mark.slow
def test_evaluate_runs_on_the_bundled_heldout_prompts_and_counts_rejected_rows(tmp_path, capsys):
    out = tmp_path / "eval"
    assert main(["evaluate", "--model", STORIES, "--eval-set", HELDOUT, "--limit", "2", "--output", str(out),
                 "--runner", "FnApiRunner", "--samples", "2", "generation.max_new_tokens=16", SMALL_ENGINE]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["models"]["stories260K"]["story_heldout"]["overall"]["prompts"] == 2
    assert json.loads((out / "inputs.json").read_text()) == {HELDOUT: {"rows": 64, "rejected": {}}}
    # A set with some bad rows is evaluated on the good ones, and says how many it left out.
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(open(HELDOUT, encoding="utf-8").readline() + '{"foo": 1}\n')
    assert main(["evaluate", "--model", STORIES, "--eval-set", str(mixed), "--output", str(tmp_path / "mixed"),
                 "--runner", "FnApiRunner", "--samples", "1", "generation.max_new_tokens=8", SMALL_ENGINE]) == 0
    assert json.loads((tmp_path / "mixed" / "inputs.json").read_text())[str(mixed)] == {
        "rows": 1, "rejected": {"unknown_format": 1}}
    assert "1 row(s) rejected" in capsys.readouterr().out
