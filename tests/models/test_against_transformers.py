"""Families the goldens do not cover (Qwen3 q/k-norm, Llama 3 RoPE scaling, untied Llama) and our own
mixtures of experts, checked against transformers itself: our save_pretrained output must load there
unchanged and give our logits."""

import jax
import numpy as np
import pytest

from rlax_core.models import Model, RopeScaling, init_params, save_pretrained, toy_config
from rlax_core.models.config import MoeConfig, toy_moe_config

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
    # Exported mixtures of experts, sharded with their index: layer 0 dense (mlp_only_layers) ...
    "qwen3_moe_mixed_layers": toy_moe_config(tie_word_embeddings=False),
    # ... every second layer sparse, with the gated shared expert ...
    "qwen2_moe_shared_expert": toy_moe_config(
        architecture="qwen2_moe", qkv_bias=True, qk_norm=False, num_layers=4,
        moe=MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=32, normalize_top_k=False,
                      sparse_step=2, shared_expert_intermediate_size=48)),
    # ... and every layer sparse, stacked (what `rlax upcycle` writes).
    "mixtral": toy_moe_config(architecture="mixtral", qk_norm=False, num_layers=2, intermediate_size=32,
                              moe=MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=32)),
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
    written = save_pretrained(model, tmp_path, max_shard_size="100KB" if config.moe else "5GB")
    assert ("model.safetensors.index.json" in written) == (config.moe is not None)
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
