"""``rlax train`` on the quickstart config exports Hugging Face folders; every reader gets the trainer's weights."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from pipelines.cli import main
from rlax_core.data.rollout_store import RolloutStore
from rlax_core.tasks.story import story_examples, write_jsonl
from rlax_core.models import Model, from_pretrained, load_tokenizer
from rlax_core.training.checkpoint import Checkpointer
from rlax_core.policy.source import load_policy, parse_policy_source

from training_helpers import write_random_groups

# The run is trained once for the module (about 15 s on 2 idle cores, 30 s on busy ones): the slow lane.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = 2
IDS = np.array([[1, 403, 261, 407, 312, 290, 380, 395, 269]], np.int32)  # BOS and a few story tokens


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2-step run of the quickstart's config (stories260K, GRPO) on rollout groups already in its store."""
    output = tmp_path_factory.mktemp("run")
    write_random_groups(RolloutStore(output / "rollouts", "quickstart"), range(STEPS), groups_per_step=2, vocab=512)
    assert main(["train", "--config", str(REPO / "configs" / "quickstart.yaml"), "--output", str(output),
                 f"trainer.total_steps={STEPS}", "trainer.groups_per_step=2", "trainer.max_seq_len=16",
                 "trainer.export_every=1", "trainer.checkpoint_every=1", "trainer.poll_s=0.1",
                 "trainer.wait_timeout_s=120", "trainer.optimizer.learning_rate=0.01",
                 "loop.sampling.stop_token_ids=[13]", "trainer.wandb.enabled=true"]) == 0
    checkpointer = Checkpointer(output / "checkpoints", async_save=False)
    state, _ = checkpointer.restore(STEPS)
    checkpointer.close()
    # On the host: logits of params sharded over the test's 8 devices differ in the last bit.
    return output, jax.tree.map(np.asarray, state["params"])


def test_train_exports_complete_folders_with_the_trainers_weights(trained):
    output, params = trained
    folders = sorted(p.name for p in (output / "hf").iterdir())
    assert folders == ["step_00000001", "step_00000002"]
    final = output / "hf" / "step_00000002"
    model = from_pretrained(final)
    for (path, exported), trainer in zip(jax.tree_util.tree_leaves_with_path(model.params), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(exported), trainer, err_msg=jax.tree_util.keystr(path))
    expected = Model(model.config, params)(IDS)
    np.testing.assert_array_equal(np.asarray(model(IDS)), np.asarray(expected))
    base = from_pretrained(REPO / "pipelines" / "assets" / "stories260K")
    assert not np.array_equal(np.asarray(base(IDS)), np.asarray(expected))  # training moved the weights

    assert {"model.safetensors", "config.json", "tokenizer.model", "tokenizer_config.json",
            "generation_config.json"} <= {p.name for p in final.iterdir()}
    text = "Once upon a time, there was a happy dog."
    assert load_tokenizer(final).encode(text, add_bos=True) == load_tokenizer(base_dir()).encode(text, add_bos=True)
    generation = json.loads((final / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 1, 13] and generation["bos_token_id"] == 1
    assert generation["temperature"] == 1.0 and generation["max_new_tokens"] == 64


def test_the_trainer_logs_to_weights_and_biases_offline(trained):
    output, _ = trained
    runs = sorted((output / "metrics" / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    data = runs[0].read_bytes()
    assert b"train/loss" in data and b"train/groups_consumed_total" in data and b"quickstart" in data


def test_weight_versions_and_checkpoints_load_through_their_model_templates(trained):
    output, params = trained
    expected = np.asarray(Model(from_pretrained(output / "hf" / "step_00000002").config, params)(IDS))
    for spec in (f"weights:{output}/weights@{STEPS}", f"{output}/weights", f"checkpoint:{output}/checkpoints@{STEPS}",
                 f"{output}/checkpoints"):
        np.testing.assert_array_equal(np.asarray(load_policy(spec)(IDS)), expected, err_msg=spec)
    assert parse_policy_source(f"{output}/weights").kind == "weights"
    assert parse_policy_source(f"{output}/checkpoints").kind == "checkpoint"
    older = np.asarray(load_policy(f"weights:{output}/weights@1")(IDS))
    np.testing.assert_array_equal(older, np.asarray(from_pretrained(output / "hf" / "step_00000001")(IDS)))


def test_a_version_or_checkpoint_that_is_not_there_is_named(trained):
    output, _ = trained
    with pytest.raises(ValueError, match="version 7 is not committed"):
        load_policy(f"weights:{output}/weights@7")
    with pytest.raises(ValueError, match="no checkpoint 9; complete checkpoints: 1, 2"):
        load_policy(f"checkpoint:{output}/checkpoints@9")


def test_rerunning_the_finished_run_exports_nothing_again(trained, capsys):
    output, _ = trained
    final = output / "hf" / "step_00000002" / "model.safetensors"
    before = final.stat().st_mtime_ns
    assert main(["train", "--config", str(REPO / "configs" / "quickstart.yaml"), "--output", str(output),
                 f"trainer.total_steps={STEPS}", "trainer.groups_per_step=2", "trainer.max_seq_len=16",
                 "trainer.export_every=1"]) == 0
    assert final.stat().st_mtime_ns == before
    assert f"rlax train: step 2; model {output}/hf/step_00000002; checkpoints {output}/checkpoints" in capsys.readouterr().out


def test_evaluate_compares_the_export_a_weight_version_and_a_checkpoint(trained, tmp_path):
    output, _ = trained
    write_jsonl(story_examples("heldout", 3), tmp_path / "heldout.jsonl")
    out = tmp_path / "eval"
    assert main(["evaluate", "--model", str(output / "hf" / "step_00000002"), "--model", f"weights:{output}/weights@2",
                 "--model", f"checkpoint:{output}/checkpoints", "--eval-set", str(tmp_path / "heldout.jsonl"),
                 "--samples", "2", "--output", str(out), "--runner", "FnApiRunner", "ks=[1, 2]",
                 "model_names=[exported, version, checkpoint]", "generation.max_new_tokens=16",
                 "generation.engine={num_slots: 8, max_prompt_len: 64, max_new_tokens: 16, prefill_buckets: [64], num_pages: 40}"]) == 0
    report = json.loads((out / "report.json").read_text())
    columns = [report["models"][name]["story_word"] for name in ("exported", "version", "checkpoint")]
    assert columns[0]["overall"]["prompts"] == 3
    assert columns[0] == columns[1] == columns[2]  # the same weights: the same samples, lengths and verdicts
    samples = [json.loads(line) for f in out.glob("samples-*.jsonl") for line in f.read_text().splitlines()]
    texts = {}
    for row in samples:
        texts.setdefault(row["id"], {})[row["model"]] = row["texts"]
    assert len(texts) == 3 and all(len({tuple(v) for v in per_model.values()}) == 1 for per_model in texts.values())


def base_dir():
    return REPO / "pipelines" / "assets" / "stories260K"


@pytest.mark.parametrize("spec, says", [
    ("weights:{output}/weights@7", "weights:{output}/weights@7: no committed weight version 7; there are: 0, 1, 2"),
    ("checkpoint:{output}/checkpoints@9", "checkpoint:{output}/checkpoints@9: no complete checkpoint 9; there are: "),
])
def test_a_version_that_does_not_exist_is_one_line_before_any_work(trained, tmp_path, capsys, spec, says):
    """A real weight store and checkpoint folder, asked for a version they do not hold (issue 30's tracebacks)."""
    output, _ = trained
    write_jsonl(story_examples("heldout", 1), tmp_path / "heldout.jsonl")
    for command in (["evaluate", "--eval-set", str(tmp_path / "heldout.jsonl")],
                    ["filter", "--input", str(tmp_path / "heldout.jsonl")]):
        model = spec.format(output=output)
        assert main([*command, "--model", model, "--output", str(tmp_path / command[0])]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"rlax {command[0]}: input error: ")
        assert says.format(output=output) in error and "\n" not in error, error
        assert not (tmp_path / command[0]).exists() or not any((tmp_path / command[0]).iterdir())  # no work started
