"""On-policy distillation: a teacher's per-token log-probs of the student's samples, their rewards, the
rows and batches that carry them, the advantages they join, and the teacher a run refuses."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.config import ConfigError, from_dict
from rlax_core.data.records import ROLLOUT_SCHEMA, to_table
from rlax_core.models import from_pretrained
from rlax_core.models.export import export_hf
from rlax_core.models.transformer import forward
from rlax_core.rewards import RewardConfig
from rlax_core.rewards.distillation import DistillationConfig, Teacher, check_teacher, distill_rows
from rlax_core.rewards.reward_model import scoring_stage_hints
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rollout.metrics import group_summary, step_metrics
from rlax_core.training.batching import make_batch
from rlax_core.training.rl_objective import PolicyGradientObjective
from tests.support.tolerances import assert_reordered_close, decoder_logprob_bound

STORIES = Path(__file__).resolve().parents[2] / "pipelines" / "assets" / "stories260K"
STUDENT = str(STORIES / "stories260K.bin")


def sharpened_teacher(folder: Path) -> Path:
    """stories260K at temperature 0.5: its final norm doubled doubles every logit (the embeddings are tied)."""
    model = from_pretrained(STUDENT)
    params = {**model.params, "norm": {"scale": model.params["norm"]["scale"] * 2.0}}
    export_hf(folder, model.config, params, tokenizer_source=STORIES / "tok512.model")
    return folder


@pytest.fixture(scope="module")
def teacher_folder(tmp_path_factory):
    return sharpened_teacher(tmp_path_factory.mktemp("teacher"))


def _plain_logprobs(folder, ids):
    """The teacher's log-prob of each token after the first: one unpadded forward, log-softmax in float32."""
    model = from_pretrained(folder)
    logits = forward(model.params, model.config, jnp.asarray([ids], jnp.int32)).astype(jnp.float32)[0]
    log_probs = np.asarray(jax.nn.log_softmax(logits, axis=-1))
    return np.asarray([log_probs[t, ids[t + 1]] for t in range(len(ids) - 1)])


def test_the_teachers_logprobs_equal_a_plain_forward_of_the_teacher(teacher_folder):
    samples = [([1, 403, 73, 261], [280, 45, 2]), ([1, 9], [30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43]),
               ([1, 403, 73], [2])]
    teacher = Teacher(DistillationConfig(teacher=str(teacher_folder), batch_size=2), STUDENT)
    got = teacher.completion_logprobs(samples)  # two forwards: a full batch of 2, then 1 row and a filler
    teacher_config = from_pretrained(teacher_folder).config
    for (prompt, completion), theirs in zip(samples, got):
        plain = _plain_logprobs(teacher_folder, [*prompt, *completion])[len(prompt) - 1:]
        assert theirs.shape == (len(completion),)
        # A batch of 2 against 1: the same sums, tiled and added in another order.
        assert_reordered_close(theirs, plain, decoder_logprob_bound(teacher_config, context=len(prompt) + len(completion)))


def _rows(behavior, teacher_logprobs=None):
    return [{"example_id": "e", "group_id": "g", "sample_idx": i, "policy_version": 0, "seed": 0,
             "prompt_ids": [1, 403], "completion_ids": [280 + i, 45, 2][:len(lp)], "behavior_logprobs": list(lp),
             "finish_reason": "stop", "reward": 0.0, "reward_info": json.dumps({"pass": False})}
            for i, lp in enumerate(behavior)]


def test_token_rewards_are_the_negative_reverse_kl_to_the_teacher_times_the_weight(teacher_folder):
    behavior = [[-1.0, -2.0, -0.5], [-3.0, -0.25]]
    teacher = Teacher(DistillationConfig(teacher=str(teacher_folder), weight=0.5), STUDENT)
    rows = distill_rows(teacher, _rows(behavior))
    theirs = teacher.completion_logprobs([(r["prompt_ids"], r["completion_ids"]) for r in rows])
    for row, lp, t in zip(rows, behavior, theirs):
        np.testing.assert_allclose(row["token_rewards"], -0.5 * (np.asarray(lp) - t), atol=1e-6)
        info = json.loads(row["reward_info"])
        assert info["pass"] is False and info["distillation"]["tokens"] == len(lp)
        np.testing.assert_allclose(info["distillation"]["reverse_kl"], np.mean(np.asarray(lp) - t), atol=1e-6)
    # The step's metric: reverse KL per token over every token of the step.
    summary = group_summary({"key": (0, 0), "rows": rows, "generate_seconds": 1.0, "worker": "w"}, written=True)
    metrics = step_metrics(0, [summary])
    expected = np.concatenate([np.asarray(lp) - t for lp, t in zip(behavior, theirs)]).mean()
    np.testing.assert_allclose(metrics["distill_reverse_kl"], expected, atol=1e-6)
    assert "distill_reverse_kl" not in step_metrics(0, [group_summary(
        {"key": (0, 0), "rows": _rows(behavior), "generate_seconds": 1.0, "worker": "w"}, written=True)])


def test_an_episodes_observation_tokens_get_no_token_reward(teacher_folder):
    teacher = Teacher(DistillationConfig(teacher=str(teacher_folder)), STUDENT)
    [row] = distill_rows(teacher, [{**_rows([[-1.0, 0.0, -0.5]])[0], "policy_mask": [1, 0, 1]}])
    assert row["token_rewards"][1] == 0.0 and row["token_rewards"][0] != 0.0
    assert json.loads(row["reward_info"])["distillation"]["tokens"] == 2


def test_the_batch_carries_token_rewards_and_the_advantages_add_them_undiscounted():
    rows = _rows([[-1.0, -2.0, -0.5], [-3.0, -0.25]])
    rows[0]["token_rewards"], rows[1]["token_rewards"] = [0.1, -0.2, 0.3], [0.5, 0.25]
    rows[1]["reward"] = 1.0
    batch = make_batch([to_table(rows, ROLLOUT_SCHEMA)], max_seq_len=8)
    np.testing.assert_allclose(batch["token_rewards"][0, 1:4], [0.1, -0.2, 0.3])
    np.testing.assert_allclose(batch["token_rewards"][1, 1:3], [0.5, 0.25])
    assert batch["token_rewards"][:, 4:].sum() == 0 and batch["token_rewards"][:, 0].sum() == 0
    objective = PolicyGradientObjective(AlgorithmConfig(advantage_estimator="dr_grpo"))
    arrays = {name: jnp.asarray(x) for name, x in batch.items()}
    with_tokens = objective.prepare(arrays, {})
    without = objective.prepare({k: v for k, v in arrays.items() if k != "token_rewards"}, {})
    np.testing.assert_allclose(with_tokens["advantages"] - without["advantages"], batch["token_rewards"], atol=1e-6)
    metrics = objective.batch_metrics(arrays, with_tokens)
    np.testing.assert_allclose(metrics["token_reward_mean"], np.mean([0.1, -0.2, 0.3, 0.5, 0.25]), atol=1e-6)
    # A batch of rollouts without token rewards has none; a row whose count is wrong is named.
    assert "token_rewards" not in make_batch([to_table(_rows([[-1.0]]), ROLLOUT_SCHEMA)], max_seq_len=8)
    rows[1]["token_rewards"] = [0.5]
    with pytest.raises(ValueError, match=r"rollout g#1: 1 token rewards for 2 completion tokens"):
        make_batch([to_table(rows, ROLLOUT_SCHEMA)], max_seq_len=8)


def _word_tokenizer(folder: Path) -> Path:
    tokenizers = pytest.importorskip("tokenizers")
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({"[UNK]": 0, "Once": 3, "upon": 4, "a": 5},
                                                             unk_token="[UNK]"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    words.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"unk_token": "[UNK]"}))
    return folder


def test_a_teacher_of_another_tokenizer_is_refused_in_one_line(teacher_folder, tmp_path):
    check_teacher(STUDENT, DistillationConfig(teacher=str(teacher_folder)))  # the same tokenizer: accepted
    other = DistillationConfig(teacher=str(teacher_folder), tokenizer=str(_word_tokenizer(tmp_path)))
    with pytest.raises(ConfigError, match=r"rewards\.distillation\.teacher: .*its tokenizer is not the student's "
                                          r"\(512 tokens against the teacher's 4\)") as caught:
        check_teacher(STUDENT, other)
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="its tokenizer is not the student's"):
        Teacher(other, STUDENT)


def test_a_run_with_a_teacher_of_another_tokenizer_does_not_start(teacher_folder, tmp_path, capsys):
    from pipelines.cli import main

    tokenizer = _word_tokenizer(tmp_path)
    output = tmp_path / "run"
    code = main(["rollout", "--config", str(STORIES.parents[2] / "configs" / "quickstart.yaml"),
                 "--train-set", str(tmp_path / "none.jsonl"), f"run.output_dir={output}",
                 f"loop.rewards.distillation.teacher={teacher_folder}", f"loop.rewards.distillation.tokenizer={tokenizer}"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and len(error.splitlines()) == 1, error
    assert "loop.rewards.distillation.teacher" in error and "its tokenizer is not the student's" in error
    assert not output.exists()


def test_the_teacher_is_placed_as_a_reward_model_is():
    rewards = from_dict(RewardConfig, {"terms": {"task": 1.0}, "distillation": {"teacher": "t"}})
    assert scoring_stage_hints(rewards) is None  # on the rollout worker, beside the engine
    hints = {"accelerator": "type:nvidia-l4;count:1"}
    own = from_dict(RewardConfig, {"terms": {"task": 1.0}, "distillation": {
        "teacher": "t", "placement": "own_stage", "resource_hints": hints}})
    assert scoring_stage_hints(own) == hints
    with pytest.raises(ConfigError, match=r"distillation\.resource_hints: apply to placement: own_stage"):
        from_dict(RewardConfig, {"terms": {"task": 1.0}, "distillation": {"teacher": "t", "resource_hints": hints}})
    with pytest.raises(ConfigError, match=r"give distillation and reward_model the same resource_hints"):
        from_dict(RewardConfig, {"terms": {"reward_model": 1.0}, "reward_model": {
            "path": "rm", "placement": "own_stage", "resource_hints": {"min_ram": "64GB"}}, "distillation": {
            "teacher": "t", "placement": "own_stage", "resource_hints": hints}})
    with pytest.raises(ConfigError, match=r"distillation\.weight: must be a finite number > 0"):
        from_dict(RewardConfig, {"terms": {"task": 1.0}, "distillation": {"teacher": "t", "weight": 0}})


def test_the_scoring_stage_adds_the_teachers_token_rewards_to_every_row(teacher_folder):
    """Through the rollout stream's ``ScoreRollouts`` (two DoFn instances of one process, as a worker's
    threads): each row gets its token rewards, and the teacher is read once for the process."""
    import rlax_core.tasks  # noqa: F401 - registers story_word
    from rlax_core.rewards.reward_model import _PROCESS_MODELS
    from tests.support.rollout_spec import rollout_spec
    from transforms.rollout import ScoreRollouts

    rewards = from_dict(RewardConfig, {"terms": {"story_word": 0.0}, "distillation": {"teacher": str(teacher_folder)}})
    spec = rollout_spec(model_path=STUDENT, rewards=rewards)
    example = {"id": "e", "task": "story", "prompt": "Once upon a time", "answer": "cat"}
    rows = [{**row, "reward": None, "reward_info": None} for row in _rows([[-1.0, -2.0, -0.5], [-3.0, -0.25]])]
    group = {"key": (0, 0), "example": example, "rows": rows, "texts": [" a cat.", " the"]}
    scored = []
    for _ in range(2):
        score = ScoreRollouts(spec)
        score.setup()
        [out] = list(score.process(group))
        scored.append(out)
        score.teardown()
    teachers = [key for key in _PROCESS_MODELS if key[:2] == ("teacher", str(teacher_folder))]
    assert len(teachers) == 1
    for out in scored:
        for row in out["rows"]:
            assert len(row["token_rewards"]) == len(row["completion_ids"])
            info = json.loads(row["reward_info"])
            assert "distillation" in info and "story_word" in info["terms"]
    assert scored[0]["rows"][0]["token_rewards"] == scored[1]["rows"][0]["token_rewards"]
