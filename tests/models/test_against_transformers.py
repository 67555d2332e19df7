"""Families the goldens do not cover (Qwen3 q/k-norm, Llama 3 RoPE scaling, untied Llama), checked
against transformers itself: our save_pretrained output must load there unchanged and give our logits."""

import jax
import numpy as np
import pytest

from rlax_core.models import Model, RopeScaling, init_params, save_pretrained, toy_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CASES = {
    "qwen3_tied": toy_config(architecture="qwen3", qkv_bias=False, qk_norm=True, rope_theta=1e6),
    "llama3_rope_scaling": toy_config(
        architecture="llama", qkv_bias=False, tie_word_embeddings=False, rope_theta=500000.0,
        rope_scaling=RopeScaling("llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=16)),
    "qwen2_untied_linear_rope": toy_config(tie_word_embeddings=False,
                                           rope_scaling=RopeScaling("linear", factor=2.0)),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", CASES)
def test_transformers_loads_our_checkpoint_and_agrees(tmp_path, name):
    config = CASES[name]
    params = init_params(config, jax.random.key(0))
    # Random norms and biases too, so that every parameter matters to the comparison.
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree.unflatten(tree, [x + 0.1 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    model = Model(config, params)
    save_pretrained(model, tmp_path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32,
                                                                  attn_implementation="eager").eval()
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (2, 40))
    mask = np.ones_like(ids)
    mask[1, 30:] = 0
    with torch.inference_mode():
        theirs = reference(torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).logits.numpy()
    ours = np.asarray(model(ids, mask))
    real = mask.astype(bool)
    np.testing.assert_allclose(ours[real], theirs[real], atol=1e-4, rtol=0)
