"""DPO against TRL's ``DPOTrainer`` on one tiny Llama (the ``bench`` extra: torch, transformers, trl).

The model is built with transformers in the test and saved as a Hugging Face folder; the project
loads that folder (``rlax_core.models.from_pretrained``), and a second random Llama is the frozen
reference of both. The same pairs go through TRL's own collator and ``compute_loss`` (its loss
and its logged metrics) and through the project's trainer (packed rows, micro-batches). Loss,
metrics and every parameter's gradient agree within 1e-4. TRL's gradients are mapped onto the
project's parameter tree by the project's own loader: they are saved as a model of their own and
loaded back (every layout change of the loader is a transpose, a split or a permutation, which
carries gradients as it carries weights).

TRL as of 1.x: ``DPOConfig.loss_type`` a list with ``loss_weights`` ("sft" is its chosen-NLL term),
IPO on per-token mean log-ratios, metrics in ``trainer._metrics["train"]``. Skips where the bench
extra is not installed.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
trl = pytest.importorskip("trl", minversion="1.0")
datasets = pytest.importorskip("datasets")

from rlax_core.models import from_pretrained  # noqa: E402
from rlax_core.parallel import make_mesh  # noqa: E402
from rlax_core.training.config import OptimizerConfig, TrainerConfig  # noqa: E402
from rlax_core.training.post_config import DpoConfig  # noqa: E402
from rlax_core.training.preference import PreferenceObjective  # noqa: E402
from rlax_core.training.sft_data import Tokenized, preference_batch  # noqa: E402
from rlax_core.training.step import Trainer  # noqa: E402

VOCAB, PAD, BOS, EOS = 64, 0, 1, 2
MAX_LEN = 16
TOLERANCE = 1e-4
# TRL's metric -> the project's (rlax_core.training.preference.batch_loss)
METRICS = {"rewards/chosen": "rewards_chosen", "rewards/rejected": "rewards_rejected",
           "rewards/margins": "rewards_margin", "rewards/accuracies": "rewards_accuracy"}


def tiny_llama(seed: int):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      rms_norm_eps=1e-6, tie_word_embeddings=False, pad_token_id=PAD,
                                      bos_token_id=BOS, eos_token_id=EOS)
    model = transformers.LlamaForCausalLM(config).to(torch.float32)
    with torch.no_grad():  # a random init far from uniform: log-ratios of a few nats, rewards that differ
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.3)
    return model


def word_tokenizer():
    """A tokenizer TRL's constructor can hold (it tokenizes the dataset it is given; the pairs compared
    here go in as ids): one word per id."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"t{i}": i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t3"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="t0", bos_token="t1",
                                                eos_token="t2", unk_token="t3")


def id_pairs(count=4, seed=1):
    """Pairs of one prompt each, chosen and rejected of different lengths."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(count):
        prompt = rng.integers(4, VOCAB, int(rng.integers(3, 6))).tolist()
        chosen, rejected = (rng.integers(4, VOCAB, int(rng.integers(2, 8))).tolist() for _ in range(2))
        pairs.append({"prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return pairs


def trl_dpo(policy, reference, pairs, args, tmp_path):
    """TRL's loss (a float), metrics and gradients (torch tensors by parameter name) on ``pairs``."""
    dataset = datasets.Dataset.from_dict({"prompt": ["t5 t6"], "chosen": [" t7"], "rejected": [" t8"]})
    config = trl.DPOConfig(output_dir=str(tmp_path / "trl"), report_to=[], use_cpu=True, bf16=False, fp16=False,
                           max_length=None, per_device_train_batch_size=len(pairs), **args)
    trainer = trl.DPOTrainer(model=policy, ref_model=reference, args=config, train_dataset=dataset,
                             processing_class=word_tokenizer())
    trainer.model.train()
    batch = {key: value.to(trainer.accelerator.device) for key, value in trainer.data_collator(pairs).items()}
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    metrics = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    grads = {name: parameter.grad.detach().clone() for name, parameter in trainer.model.named_parameters()}
    return loss.item(), metrics, grads


def as_project_tree(model, values, folder):
    """``values`` (tensors by ``model``'s parameter names) as the project's parameter tree: saved as
    that model's weights and loaded by the project's loader."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(values[name])
    model.save_pretrained(folder, safe_serialization=True)
    return from_pretrained(folder, dtype=jnp.float32).params


def project_dpo(policy_folder, reference_folder, pairs, config: DpoConfig):
    policy, reference = from_pretrained(policy_folder, dtype=jnp.float32), from_pretrained(reference_folder,
                                                                                             dtype=jnp.float32)
    trainer_config = TrainerConfig(max_seq_len=MAX_LEN, row_tokens=32, micro_batch_tokens=32,
                                   optimizer=OptimizerConfig(learning_rate=1e-3))
    trainer = Trainer(policy.config, PreferenceObjective(config), trainer_config,
                      make_mesh(trainer_config.mesh, jax.devices()[:1]))
    samples = []
    for i, pair in enumerate(pairs):
        prompt = pair["prompt_ids"]
        for completion in (pair["chosen_ids"], pair["rejected_ids"]):
            samples.append(Tokenized(f"p{i}", np.asarray(prompt + completion, np.int32),
                                     np.r_[np.zeros(len(prompt)), np.ones(len(completion))].astype(np.float32)))
    batch = trainer.pack(preference_batch(list(zip(samples[::2], samples[1::2])), max_seq_len=MAX_LEN))
    state = trainer.init_state(policy.params)
    loss, grads = trainer.gradients(state, batch, reference.params)
    _, metrics = trainer.step(state, batch, reference.params)
    return float(loss), {k: float(v) for k, v in metrics.items()}, grads


@pytest.mark.parametrize("ours, theirs", [
    (DpoConfig(beta=0.5), {"beta": 0.5, "loss_type": ["sigmoid"]}),
    (DpoConfig(beta=0.5, sft_coef=0.3), {"beta": 0.5, "loss_type": ["sigmoid", "sft"], "loss_weights": [1.0, 0.3]}),
    (DpoConfig(beta=0.2, loss="ipo"), {"beta": 0.2, "loss_type": ["ipo"]}),
])
def test_loss_metrics_and_gradients_equal_trls_dpo_trainer(ours, theirs, tmp_path):
    policy, reference = tiny_llama(0), tiny_llama(1)
    policy.save_pretrained(tmp_path / "policy", safe_serialization=True)
    reference.save_pretrained(tmp_path / "reference", safe_serialization=True)
    pairs = id_pairs()

    trl_loss, trl_metrics, trl_grads = trl_dpo(policy, reference, pairs, theirs, tmp_path)
    loss, metrics, grads = project_dpo(tmp_path / "policy", tmp_path / "reference", pairs, ours)

    assert abs(trl_metrics["rewards/margins"]) > 0.05  # the policy is not its reference: a comparison with content
    np.testing.assert_allclose(loss, trl_loss, rtol=TOLERANCE, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["loss"], trl_loss, rtol=TOLERANCE, atol=TOLERANCE)
    for theirs_name, ours_name in METRICS.items():
        np.testing.assert_allclose(metrics[ours_name], trl_metrics[theirs_name], rtol=TOLERANCE, atol=TOLERANCE,
                                   err_msg=theirs_name)
    want = as_project_tree(tiny_llama(0), trl_grads, tmp_path / "trl_grads")
    assert jax.tree.structure(grads) == jax.tree.structure(want)
    leaves = jax.tree_util.tree_leaves_with_path(grads)
    assert max(float(np.abs(np.asarray(g)).max()) for _, g in leaves) > 1e-3  # gradients with content
    for (path, got), expected in zip(leaves, jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=TOLERANCE, atol=TOLERANCE,
                                   err_msg=jax.tree_util.keystr(path))
