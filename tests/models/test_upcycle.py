"""Sparse upcycling: stories260K's MLPs copied into experts give its logits back, and `rlax upcycle` writes a
model folder the whole stack loads."""

import jax
import numpy as np
import pytest

from pipelines.cli import main
from rlax_core.config import ConfigError
from rlax_core.models import from_pretrained, toy_config
from rlax_core.models.transformer import forward, forward_with_routing, init_params
from rlax_core.models.upcycle import upcycle
from tests.support.tolerances import assert_reordered_close, decoder_logit_bound

IDS = np.array([[1, 403, 407, 261, 378, 30, 61, 90], [1, 403, 407, 0, 0, 0, 0, 0]], np.int32)
MASK = (np.arange(8) < np.array([[8], [3]])).astype(np.int32)


@pytest.fixture(scope="module")
def stories(stories260k_dir):
    return from_pretrained(stories260k_dir)


@pytest.mark.parametrize("experts_per_token", [4, 2])
def test_identical_experts_give_the_dense_models_logits(stories, experts_per_token):
    """Zero noise: every expert is the MLP and the chosen weights sum to one, with all 4 experts
    routed or any 2 of them."""
    config, params = upcycle(stories.config, stories.params, num_experts=4, experts_per_token=experts_per_token,
                             noise=0.0, rng=jax.random.key(0))
    assert config.architecture == "mixtral" and config.moe_layers == tuple(range(config.num_layers))
    logits, routing = forward_with_routing(params, config, IDS, attention_mask=MASK)
    real = MASK.astype(bool)
    # Equal to float32 rounding: a weighted sum whose weights add to 1 (logits reach 16 in size), within
    # the bound of the dense model's sums added in another order.
    assert_reordered_close(np.asarray(logits)[real], np.asarray(stories(IDS, MASK))[real],
                           decoder_logit_bound(config, context=IDS.shape[1]))
    assert len(np.unique(np.asarray(routing.expert_ids))) > 1  # the router spreads tokens, yet nothing changes


def test_noise_makes_the_experts_differ_a_little(stories):
    config, params = upcycle(stories.config, stories.params, num_experts=4, experts_per_token=2, noise=0.01,
                             rng=jax.random.key(0))
    gate = np.asarray(params["layers"]["moe"]["gate_proj"])
    dense = np.asarray(stories.params["layers"]["mlp"]["gate_proj"]["kernel"])
    relative = np.std(gate - dense[:, None]) / np.std(dense)
    assert 0.005 < relative < 0.02 and not np.array_equal(gate[:, 0], gate[:, 1])
    difference = np.abs(np.asarray(forward(params, config, IDS)) - np.asarray(stories(IDS)))
    assert 0 < difference.max() < 0.5


def test_rlax_upcycle_writes_a_folder_that_loads_as_the_mixture(stories, stories260k_dir, tmp_path, capsys):
    out = tmp_path / "stories260K-moe"
    assert main(["upcycle", "--model", str(stories260k_dir), "--out", str(out), "--experts", "4",
                 "--experts-per-token", "2", "--noise", "0"]) == 0
    assert "4 experts per layer, 2 per token" in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "tokenizer.model"} <= {p.name for p in out.iterdir()}
    model = from_pretrained(out)
    assert model.config.moe.num_experts == 4 and model.config.tie_word_embeddings == stories.config.tie_word_embeddings
    real = MASK.astype(bool)
    np.testing.assert_allclose(np.asarray(model(IDS, MASK))[real], np.asarray(stories(IDS, MASK))[real], atol=1e-5,
                               rtol=2e-6)


def test_only_a_dense_llama_upcycles():
    config = toy_config()  # Qwen2: its q/k/v biases have no place in Mixtral
    with pytest.raises(ConfigError, match="architecture"):
        upcycle(config, init_params(config, jax.random.key(0)), num_experts=2, experts_per_token=1, noise=0.0,
                rng=jax.random.key(0))
