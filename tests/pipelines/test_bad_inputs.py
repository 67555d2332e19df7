"""Every command checks its inputs before heavy work: each kind of bad input is one line on stderr and a
non-zero exit, never a traceback and never an exit 0 with nothing produced (issue 30's cases)."""

import json
import signal
from pathlib import Path

import pytest

from pipelines.cli import main

REPO = Path(__file__).resolve().parents[2]
STORIES = str(REPO / "pipelines" / "assets" / "stories260K")
HELDOUT = str(REPO / "pipelines" / "assets" / "story_task" / "heldout.jsonl")
MISSING = "/nonexistent/rlax-input"
REWARD = "loop.rewards.terms={story_word: 1.0}"  # the loop names its reward; these cases are about inputs


def _files(tmp: Path) -> dict[str, str]:
    """The bad inputs, made real on disk."""
    (tmp / "empty.jsonl").write_text("")
    (tmp / "binary.jsonl").write_bytes(bytes(b for b in range(256) if b != 10) * 8)  # one line, not UTF-8
    (tmp / "other.jsonl").write_text("".join(json.dumps({"question": f"q{i}", "label": i}) + "\n" for i in range(4)))
    (tmp / "folder").mkdir()
    (tmp / "folder" / "rows.jsonl").write_text(Path(HELDOUT).read_text())
    (tmp / "store" / "committed").mkdir(parents=True)  # a weight store without its model template
    (tmp / "ckpt" / "3").mkdir(parents=True)
    return {name: str(tmp / name) for name in ("empty.jsonl", "binary.jsonl", "other.jsonl", "folder", "store", "ckpt")}


CASES = [
    # exit 0 with nothing produced, before
    ("curate-empty", ["curate", "--input", "{empty.jsonl}", "--output", "{tmp}/c"], "wrote no example: its input holds no rows"),
    ("curate-binary", ["curate", "--input", "{binary.jsonl}", "--output", "{tmp}/c"],
     "wrote no example: none of its 1 input rows was kept (1 non_utf8"),
    ("curate-wrong-schema", ["curate", "--input", "{other.jsonl}", "--format", "gsm8k", "--output", "{tmp}/c"],
     "wrote no example: none of its 4 input rows was kept (4 missing_field"),
    ("filter-empty", ["filter", "--input", "{empty.jsonl}", "--model", STORIES, "--output", "{tmp}/f"],
     "wrote no prompt: its input holds no rows"),
    # tracebacks, before
    ("curate-folder", ["curate", "--input", "{folder}", "--output", "{tmp}/c"],
     "a folder, but not one that datasets' save_to_disk wrote"),
    ("curate-malformed-hf", ["curate", "--input", "hf:a:b:c:d", "--output", "{tmp}/c"],
     "input hf:a:b:c:d: write hf:NAME, hf:NAME:SPLIT or hf:NAME:CONFIG:SPLIT"),
    ("curate-missing-hf", ["curate", "--input", f"hf:{MISSING}", "--output", "{tmp}/c"],
     f"input hf:{MISSING}: cannot open the dataset"),
    ("filter-weights", ["filter", "--input", HELDOUT, "--model", "weights:{store}@4", "--output", "{tmp}/f"],
     "weights:{store}@4: no model template {store}/model/config.json"),
    ("evaluate-checkpoint", ["evaluate", "--model", "checkpoint:{ckpt}@7", "--eval-set", HELDOUT, "--output", "{tmp}/e"],
     "checkpoint:{ckpt}@7: no model template"),
    ("rollout-wrong-schema", ["rollout", "--train-set", "{other.jsonl}", REWARD, "run.output_dir={tmp}/r"],
     "not Example rows (no id, prompt, task; found label, question)"),
    ("launch-wrong-schema", ["launch", "--train-set", "{other.jsonl}", REWARD, "run.output_dir={tmp}/l"],
     "train set {other.jsonl}: not Example rows"),
    # not refused before work started, before
    ("launch-negative-timeout", ["launch", "--timeout-s", "-1", "--train-set", HELDOUT], "--timeout-s: seconds > 0, got -1"),
    ("quickstart-negative-count", ["quickstart", "--filter-prompts", "-1", "--output", "{tmp}/q"],
     "--filter-prompts: a number of prompts >= 1, got -1"),
    # a rehearsal of a recipe that would not fit its hardware, or without the rows it reads
    ("rehearse-does-not-fit", ["launch", "--config", "qwen25_7b_math_dataflow_tpu.yaml", "--rehearse",
                               "hardware.rollout.memory_gib=1", "--output", "{tmp}/rh"],
     "config error: engine.num_pages: auto: v5e's memory left beside the weights and programs holds 0 pages"),
    ("rehearse-without-rows", ["launch", "--config", "qwen25_7b_math_dataflow_tpu.yaml", "--rehearse", "--data",
                               "{tmp}/none", "--output", "{tmp}/rh"],
     "{tmp}/none/math/*.jsonl (a checkout has them in tests/fixtures/data; give --data FOLDER)"),
    # one refusal for one mistake: a loop without a train set, in rollout and in launch alike
    ("rollout-no-train-set", ["rollout", REWARD, "run.output_dir={tmp}/r"], "config error: loop.train_set: say which prompts"),
    ("launch-no-train-set", ["launch", REWARD, "run.output_dir={tmp}/l"], "config error: loop.train_set: say which prompts"),
]


@pytest.mark.parametrize("argv, says", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_bad_input_is_one_line_and_a_non_zero_exit(argv, says, tmp_path, capsys):
    names = {**_files(tmp_path), "tmp": str(tmp_path)}

    def fill(text: str) -> str:
        for name, value in names.items():
            text = text.replace("{" + name + "}", value)
        return text

    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main([fill(a) for a in argv])
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert not any("Traceback" in line for line in lines), "\n".join(lines[-30:])
    assert lines and lines[-1].startswith(f"rlax {argv[0]}: ") and fill(says) in lines[-1], lines[-5:]


def test_allow_empty_accepts_an_empty_result(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["curate", "--input", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "c"),
                 "--allow-empty"]) == 0
    assert json.loads((tmp_path / "c" / "stats.json").read_text())["kept"] == 0
