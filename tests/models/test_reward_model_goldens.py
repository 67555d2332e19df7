"""Sequence-classification reward models against transformers itself (the bench extra): a tiny Llama and
a tiny Qwen2 (and Qwen3) reward model made by transformers load here with equal scores, and ours,
exported, load there with equal scores."""

import jax
import numpy as np
import pytest

from rlax_core.models import from_pretrained, init_params, save_pretrained, toy_config
from rlax_core.models.checkpoint import Model
from rlax_core.training.reward_model import init_reward_params, reward_model_config, sequence_scores

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # as test_against_transformers: torch builds and runs each model

SHAPE = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, num_labels=1)
FAMILIES = {"llama": ("LlamaConfig", "LlamaForSequenceClassification", {}),
            "qwen2": ("Qwen2Config", "Qwen2ForSequenceClassification", {}),
            "qwen3": ("Qwen3Config", "Qwen3ForSequenceClassification", {})}


def _ids_and_mask():
    # Right padding with pad id 0, which the text never holds: transformers' last non-pad token is
    # the last real one.
    ids = np.random.default_rng(0).integers(3, 256, (3, 24))
    mask = np.ones_like(ids)
    mask[1, 17:], mask[2, 5:] = 0, 0
    return np.where(mask > 0, ids, 0), mask


def _their_scores(model, ids, mask):
    with torch.inference_mode():
        logits = model(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits
    assert logits.shape == (ids.shape[0], 1)
    return logits[:, 0].numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_reward_model_loads_with_equal_scores(tmp_path, family):
    config_class, model_class, extra = FAMILIES[family]
    torch.manual_seed(0)
    reference = getattr(transformers, model_class)(getattr(transformers, config_class)(**SHAPE, **extra)).eval()
    with torch.no_grad():  # a score head of real size: transformers initialises it at std 0.02
        reference.score.weight.normal_(0.0, 1.0)
    reference.save_pretrained(tmp_path, safe_serialization=True)
    ours = from_pretrained(tmp_path)
    assert ours.config.score_head and ours.config.architecture == family
    ids, mask = _ids_and_mask()
    np.testing.assert_allclose(np.asarray(sequence_scores(ours.params, ours.config, ids, mask)),
                               _their_scores(reference, ids, mask), atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_our_reward_model_exported_loads_in_transformers_with_equal_scores(tmp_path, family):
    policy = toy_config(architecture=family, qkv_bias=family == "qwen2", tie_word_embeddings=family == "qwen2")
    config = reward_model_config(policy)
    params = init_reward_params(init_params(policy, jax.random.key(0)))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    save_pretrained(Model(config, params), tmp_path)
    theirs = transformers.AutoModelForSequenceClassification.from_pretrained(
        tmp_path, dtype=torch.float32, attn_implementation="eager").eval()
    assert type(theirs).__name__ == {"llama": "LlamaForSequenceClassification",
                                     "qwen2": "Qwen2ForSequenceClassification"}[family]
    ids, mask = _ids_and_mask()
    np.testing.assert_allclose(np.asarray(sequence_scores(params, config, ids, mask)),
                               _their_scores(theirs, ids, mask), atol=1e-4, rtol=0)


def test_our_score_head_lora_export_loads_in_peft_as_a_sequence_classifier_with_equal_scores(tmp_path):
    # rlax rm with LoRA trains adapters and the score head beside them; the job exports the merged
    # model and, inside it, a PEFT folder (task_type SEQ_CLS, modules_to_save ["score"]). PEFT's
    # AutoPeftModelForSequenceClassification reads that folder's base_model_name_or_path (here the
    # base reward model, its head still the zero it started from), applies the adapters and the saved
    # head, and must score as our merged model does.
    peft = pytest.importorskip("peft")
    from rlax_core.models.lora import init_adapters, merge
    from rlax_core.models.lora_config import LoraConfig
    from rlax_core.models.lora_export import export_peft
    from rlax_core.training.heads import split_head

    policy = toy_config(architecture="llama", qkv_bias=False, tie_word_embeddings=False)
    config, lora = reward_model_config(policy), LoraConfig(rank=4, alpha=8.0)
    base = init_reward_params(init_params(policy, jax.random.key(0)))  # a random backbone, the zero head

    def perturbed(tree, seed, scale):
        leaves, structure = jax.tree.flatten(tree)
        keys = jax.random.split(jax.random.key(seed), len(leaves))
        return jax.tree.unflatten(structure, [np.asarray(x + scale * jax.random.normal(k, x.shape), np.float32)
                                              for x, k in zip(leaves, keys)])

    base = perturbed(base, 1, 0.1)
    base["score"]["kernel"] = np.zeros_like(base["score"]["kernel"])  # not trained yet: the base's head is zero
    trained = {**perturbed(init_adapters(config, lora, jax.random.key(2)), 3, 0.05),
               "score": {"kernel": np.asarray(jax.random.normal(jax.random.key(4), (config.hidden_size,)), np.float32)}}
    adapters, head = split_head(trained)
    ours_params = {**merge(base, adapters, lora), **head}
    save_pretrained(Model(config, base), tmp_path / "base")
    export_peft(tmp_path / "adapter", config, lora, trained, base_model=str(tmp_path / "base"))

    theirs = peft.AutoPeftModelForSequenceClassification.from_pretrained(str(tmp_path / "adapter")).float().eval()
    ids, mask = _ids_and_mask()
    ours = np.asarray(sequence_scores(ours_params, config, ids, mask))
    np.testing.assert_allclose(_their_scores(theirs, ids, mask), ours, atol=1e-4, rtol=0)
    # Both parts arrived: the trained head (the base's zero head scores 0) and the adapters (the head
    # on the base's backbone alone scores otherwise).
    assert np.abs(ours).max() > 1e-2
    head_only = np.asarray(sequence_scores({**base, **head}, config, ids, mask))
    assert np.abs(head_only - ours).max() > 1e-3
