"""`rlax rft`: the generator resolved (the policy, or a teacher), bad input as one line, and a run on stories260K."""

import json
import signal
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines import rft
from pipelines.cli import build_parser, main
from rlax_core.data.records import PREFERENCE_PAIR_SCHEMA, SFT_EXAMPLE_SCHEMA
from rlax_core.tasks.story import score_story, story_examples, write_jsonl

REPO = Path(__file__).resolve().parents[2]
STORIES = str(REPO / "pipelines" / "assets" / "stories260K")
HELDOUT = str(REPO / "pipelines" / "assets" / "story_task" / "heldout.jsonl")
MISSING = "/nonexistent/rlax-input"


def _resolve(argv):
    parser = build_parser(only="rft")
    args, _ = parser.parse_known_args(["rft", *[a for a in argv if "=" not in a or a.startswith("--")]])
    args.overrides = [a for a in argv if "=" in a and not a.startswith("--")]
    return rft.resolve_config(args)


def test_the_generator_is_the_runs_policy_unless_a_teacher_is_named():
    config, _ = _resolve(["--config", "configs/rft_stories260k.yaml"])
    assert config.generator == STORIES and config.generation_spec().label == "stories260K"
    teacher, _ = _resolve(["--config", "configs/rft_stories260k.yaml", "--generator", "/models/Qwen2.5-7B-Instruct"])
    assert teacher.generation_spec().model == "/models/Qwen2.5-7B-Instruct"
    assert teacher.generation_spec().label == "Qwen2.5-7B-Instruct"
    version, _ = _resolve(["--config", "configs/rft_stories260k.yaml", "rft.generator=weights:runs/x/weights@12"])
    assert version.generation_spec().label == "weights:runs/x/weights@12"
    named, _ = _resolve(["--config", "configs/rft_stories260k.yaml", "rft.generation.name=teacher-v2"])
    assert named.generation_spec().label == "teacher-v2"


def test_the_dataflow_recipe_distils_from_its_teacher_on_the_filters_kind_of_workers():
    config, beam_args = _resolve(["--config", "configs/rft_dataflow_gpu.yaml"])
    assert config.generator == "gs://my-rlax-bucket/models/Qwen2.5-7B-Instruct"
    assert "--machine_type=a2-ultragpu-1g" in beam_args


def test_beam_rft_left_empty_takes_the_filters_options():
    from pipelines.config import BeamSpec

    beam = BeamSpec(filter={"machine_type": "g2-standard-8"})
    assert beam.args("rft") == beam.args("filter") == ["--machine_type=g2-standard-8"]
    assert BeamSpec(filter={"machine_type": "a"}, rft={"machine_type": "b"}).args("rft") == ["--machine_type=b"]


def test_the_stats_add_up_over_every_outcome():
    config, _ = _resolve(["--config", "configs/rft_stories260k.yaml"])
    outcomes = [{"reason": None, "pass_rate": 1.0, "sft": 2, "pairs": 0, "duplicates": 3},
                {"reason": None, "pass_rate": 0.5, "sft": 1, "pairs": 2, "duplicates": 0},
                {"reason": "unsolved", "pass_rate": 0.0, "sft": 0, "pairs": 0, "duplicates": 0},
                {"reason": "skipped", "pass_rate": None, "sft": 0, "pairs": 0, "duplicates": 0},
                {"reason": "malformed_json", "pass_rate": None, "sft": 0, "pairs": 0, "duplicates": 0}]
    stats = rft.rft_stats(outcomes, config)
    assert (stats["prompts"], stats["prompts_with_data"], stats["unsolved"], stats["skipped"], stats["unreadable"]) == (5, 2, 1, 1, 1)
    assert (stats["sft_examples"], stats["pairs"], stats["duplicates"], stats["all_passed"]) == (3, 2, 3, 1)
    assert stats["mean_pass_rate"] == 0.5 and stats["generator"] == "stories260K"
    assert (stats["max_per_prompt"], stats["selection"], stats["pairs_per_prompt"]) == (2, "shortest", 2)


CASES = [
    ("bad-selection", ["selection=longest"], "config error: rft.selection"),
    ("negative-cap", ["max_per_prompt=-1"], "config error: rft.max_per_prompt: an integer >= 0, got -1"),
    ("keeps-nothing", ["max_per_prompt=0"], "max_per_prompt and pairs_per_prompt are both 0"),
    ("model-not-generator", ["generation.model=x"], "config error: rft.generation.model: name the model"),
    ("unversioned-store", ["generator=weights:runs/x/weights"], "rft.generator: weights:runs/x/weights: name the version"),
    ("auto-pages", ["generation.engine.num_pages=auto"], "rft.generation.engine.num_pages: a number of pages"),
    ("missing-input", ["--input", f"{MISSING}.jsonl"], "no such file"),
    ("missing-generator", ["--generator", MISSING], f"model {MISSING}: no such file"),
    ("store-without-template", ["--generator", "weights:{tmp}/store@4"], "no model template"),
    ("empty-input", ["--input", "{tmp}/empty.jsonl", "--runner", "FnApiRunner"], "rft wrote no prompt: its input holds no rows"),
]


@pytest.mark.parametrize("argv, says", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_a_bad_input_or_setting_is_one_line_and_a_non_zero_exit(argv, says, tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "store" / "committed").mkdir(parents=True)  # a weight store without its model template
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = main(["rft", "--input", HELDOUT, "--generator", STORIES, "--output", str(tmp_path / "out"), *argv])
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and not any("Traceback" in line for line in lines), "\n".join(lines[-30:])
    assert lines[-1].startswith("rlax rft: ") and says in lines[-1], lines[-5:]


def _rows(folder: Path, prefix: str, schema):
    tables = [pq.read_table(path) for path in sorted(folder.glob(f"{prefix}-*.parquet"))]
    assert tables and all(table.schema.equals(schema) for table in tables)
    return [row for table in tables for row in table.to_pylist()]


@pytest.mark.slow  # stories260K compiles and samples 8 prompts x 16 on the FnApiRunner: about a minute
def test_rft_on_the_story_task_keeps_verified_samples_from_a_teacher_and_dead_letters_bad_rows(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    write_jsonl(story_examples("train", 8), prompts)
    bad = {**story_examples("train", 1)[0], "id": "too-long", "prompt": "Once upon a time " * 40}
    with prompts.open("a") as handle:
        handle.write(json.dumps(bad) + "\n{not json\n" + json.dumps({"id": "x", "task": "story"}) + "\n")
    # The run's policy is a model folder that does not exist: every row must come from the teacher.
    out = tmp_path / "rft"
    assert main(["rft", "--input", str(prompts), "--generator", STORIES, "--output", str(out), "--runner", "FnApiRunner",
                 f"model.path={tmp_path}/no-policy-here", "--samples", "16", "--max-per-prompt", "2",
                 "--pairs-per-prompt", "3", "generation.max_new_tokens=64", 'generation.stop_strings=["\\n"]',
                 "generation.engine={num_slots: 32, max_prompt_len: 64, max_new_tokens: 64, prefill_buckets: [32, 64], "
                 "num_pages: 256}"]) == 0
    stats = json.loads((out / "stats.json").read_text())
    sft, pairs = _rows(out, "sft", SFT_EXAMPLE_SCHEMA), _rows(out, "pairs", PREFERENCE_PAIR_SCHEMA)
    rejected = [json.loads(line) for path in out.glob("rejected-*.jsonl") for line in path.read_text().splitlines()]
    assert stats["prompts"] == 11 and stats["skipped"] == 1 and stats["unreadable"] == 2
    assert stats["prompts_with_data"] + stats["unsolved"] == 8 and stats["prompts_with_data"] >= 1
    assert (stats["sft_examples"], stats["pairs"]) == (len(sft), len(pairs)) and sft and pairs
    assert stats["generator"] == "stories260K" and stats["generator_path"] == STORIES
    assert stats["all_passed"] == sum(1 for rate in {r["example_id"]: r["pass_rate"] for r in sft}.values() if rate == 1.0)
    by_prompt = {}
    for row in sft:
        by_prompt.setdefault(row["example_id"], []).append(row)
        meta = json.loads(row["meta"])
        assert score_story(row["completion"], meta["finish_reason"])[1]["pass"]  # verified, checked again here
        assert row["generator"] == "stories260K" and row["pass_rate"] > 0 and meta["task"] == "story"
    assert all(len(rows) <= 2 for rows in by_prompt.values())
    for rows in by_prompt.values():  # shortest first: the kept ones are the prompt's shortest distinct passes
        assert len({r["completion"] for r in rows}) == len(rows) and len({r["pass_rate"] for r in rows}) == 1
    for pair in pairs:
        chosen, rejected_meta = json.loads(pair["meta"])["chosen"], json.loads(pair["meta"])["rejected"]
        assert score_story(pair["chosen"], chosen["finish_reason"])[1]["pass"]
        assert not score_story(pair["rejected"], rejected_meta["finish_reason"])[1]["pass"]
        assert pair["example_id"] in by_prompt  # a prompt with a verified sample
    reasons = sorted(r["reason"] for r in rejected)
    assert reasons == sorted(["skipped", "malformed_json", "unknown_format", *["unsolved"] * stats["unsolved"]])
    assert all(r["detail"] for r in rejected)
    assert (out / "_SUCCESS").exists()
