"""PPO's value model: the policy's backbone with a zero scalar head, aligned with the per-token arrays."""

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.models import init_params, toy_config
from rlax_core.models.transformer import forward, hidden_states
from rlax_core.training.value_model import init_value_params, token_values, value_logical_axes
from tests.support.tolerances import assert_reordered_close, decoder_logit_bound

MODEL = toy_config()
UNTIED = toy_config(tie_word_embeddings=False)


def tokens_and_mask():
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(3, MODEL.vocab_size, (3, 9)), jnp.int32)
    mask = jnp.asarray([[1] * 9, [1] * 6 + [0] * 3, [1] * 2 + [0] * 7], jnp.int32)
    return tokens, mask


def test_hidden_states_are_what_the_classifier_reads():
    params = init_params(MODEL, jax.random.key(0))
    tokens, mask = tokens_and_mask()
    hidden = hidden_states(params, MODEL, tokens, attention_mask=mask)
    logits = forward(params, MODEL, tokens, attention_mask=mask)
    # Two programs of the same sums, each in the order it compiles to.
    assert_reordered_close(hidden @ params["embed_tokens"]["embedding"].T, logits,
                           decoder_logit_bound(MODEL, context=tokens.shape[1]))


def test_critic_starts_as_the_policy_backbone_with_a_zero_head():
    params = init_params(UNTIED, jax.random.key(0))
    critic = init_value_params(params)
    assert "lm_head" in params and "lm_head" not in critic["backbone"]  # the classifier is not the critic's
    jax.tree.map(np.testing.assert_array_equal, critic["backbone"],
                 {name: tree for name, tree in params.items() if name != "lm_head"})
    tokens, mask = tokens_and_mask()
    values = token_values(critic, UNTIED, tokens, mask)
    assert values.shape == (3, 8) and values.dtype == jnp.float32
    np.testing.assert_array_equal(values, 0.0)
    # The logical axes mirror the tree leaf for leaf, so the partition rules can shard it.
    axes = value_logical_axes(UNTIED)
    leaves_axes = jax.tree.leaves(axes, is_leaf=lambda node: isinstance(node, tuple))
    assert jax.tree.structure(axes, is_leaf=lambda node: isinstance(node, tuple)) == jax.tree.structure(critic)
    assert all(len(a) == leaf.ndim for a, leaf in zip(leaves_axes, jax.tree.leaves(critic)))


def test_value_at_position_t_reads_only_tokens_up_to_t():
    critic = init_value_params(init_params(MODEL, jax.random.key(0)))
    critic["value_head"] = {"kernel": jax.random.normal(jax.random.key(1), (MODEL.hidden_size,)),
                            "bias": jnp.float32(0.5)}
    tokens, mask = tokens_and_mask()
    values = token_values(critic, MODEL, tokens, jnp.ones_like(mask))
    changed = tokens.at[:, 5].set(7)  # a later token cannot change an earlier state's value
    values_changed = token_values(critic, MODEL, changed, jnp.ones_like(mask))
    np.testing.assert_array_equal(values[:, :5], values_changed[:, :5])
    assert not np.allclose(values[:, 5:], values_changed[:, 5:])
