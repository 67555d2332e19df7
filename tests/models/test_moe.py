"""Mixtures of experts (Qwen3-MoE, Qwen2-MoE, Mixtral): transformers' logits and routing, the checkpoint layout, router
replay, the auxiliary losses, and expert parallelism on the 8 simulated devices."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from rlax_core.config import ConfigError
from rlax_core.models import CheckpointError, Model, ModelConfig, from_pretrained, save_pretrained
from rlax_core.models.config import MoeConfig, toy_moe_config
from rlax_core.models.moe import Routing, load_balancing_loss, router_z_loss
from rlax_core.models.transformer import (forward, forward_with_cache, forward_with_routing, init_cache, init_params,
                                          param_logical_axes, stack_layers, unstack_layers)
from rlax_core.parallel import MeshConfig, make_mesh, tree_shardings
from tests.support.tolerances import assert_reordered_close, decoder_logit_bound

GOLDENS = ["qwen3_moe_tiny", "qwen2_moe_tiny", "mixtral_tiny"]


def randomized(config, seed=0, scale=0.05):
    params = init_params(config, jax.random.key(seed))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


# ----------------------------------------------------------------------------- against transformers


@pytest.mark.parametrize("name", GOLDENS)
def test_logits_and_routed_experts_match_transformers_on_a_padded_batch(golden_dir, name):
    golden = np.load(golden_dir / name / "golden.npz")
    model = from_pretrained(golden_dir / name)
    config = model.config
    # What each golden covers: Qwen3-MoE a dense layer listed in mlp_only_layers between sparse ones,
    # Qwen2-MoE decoder_sparse_step 2, its gated shared expert and unnormalised top-k weights; Mixtral
    # Llama's attention with every layer sparse (stacked).
    if name == "qwen3_moe_tiny":
        assert config.moe.dense_layers == (1,) and config.moe_layers == (0, 2) and config.moe.normalize_top_k
    elif name == "mixtral_tiny":
        assert config.uniform_layers and "layers" in model.params and not config.qk_norm and not config.qkv_bias
    else:
        assert config.moe.sparse_step == 2 and config.moe_layers == (1, 3) and config.moe.shared_expert_intermediate_size
        assert not config.moe.normalize_top_k
    logits, routing = forward_with_routing(model.params, config, golden["input_ids"],
                                           attention_mask=golden["attention_mask"])
    real = golden["attention_mask"].astype(bool)
    assert not real.all(), "the golden batch should contain padding"
    np.testing.assert_allclose(np.asarray(logits)[real], golden["logits"][real], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(model(golden["input_ids"], golden["attention_mask"])), np.asarray(logits), atol=1e-5)

    k = config.moe.experts_per_token
    theirs = np.sort(np.argsort(-golden["router_logits"], axis=-1)[..., :k], axis=-1)
    assert routing.expert_ids.dtype == jnp.uint8 and routing.expert_ids.shape == (len(config.moe_layers), 2, 16, k)
    np.testing.assert_array_equal(np.sort(np.asarray(routing.expert_ids), axis=-1)[:, real], theirs[:, real])
    np.testing.assert_array_equal(routing.tokens, [real.sum()] * len(config.moe_layers))  # padding not counted


@pytest.mark.parametrize("name", GOLDENS)
def test_export_writes_transformers_names_layouts_and_config_sharded(tmp_path, golden_dir, name):
    """What transformers reads: the names, [out, in] values and config keys of its own save_pretrained
    (tests/models/test_against_transformers.py loads our folders in transformers itself, slow lane)."""
    model = from_pretrained(golden_dir / name)
    written = save_pretrained(model, tmp_path, max_shard_size="300KB")
    shards = [file for file in written if file.endswith(".safetensors")]
    assert len(shards) > 1 and "model.safetensors.index.json" in written
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    ours = {tensor: value for shard in shards for tensor, value in load_file(tmp_path / shard).items()}
    theirs = load_file(golden_dir / name / "model.safetensors")
    assert set(ours) == set(theirs) == set(index)
    for tensor, value in theirs.items():
        assert ours[tensor].shape == value.shape and np.array_equal(ours[tensor], value), tensor
    config, golden_config = (json.loads(path.read_text()) for path in (tmp_path / "config.json",
                                                                       golden_dir / name / "config.json"))
    keys = ("architectures", "model_type", "num_hidden_layers", "num_experts_per_tok", "intermediate_size",
            "tie_word_embeddings")
    if name != "mixtral_tiny":
        keys += ("moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")
        # transformers 5 writes Qwen3-MoE's expert count as num_local_experts; the Hub's configs say num_experts.
        assert config["num_experts"] == golden_config.get("num_experts", golden_config.get("num_local_experts"))
    for key in keys:
        assert config[key] == golden_config[key], key
    if name == "qwen2_moe_tiny":
        assert config["shared_expert_intermediate_size"] == golden_config["shared_expert_intermediate_size"]
    loaded = from_pretrained(tmp_path)
    assert loaded.config == model.config
    jax.tree.map(np.testing.assert_array_equal, loaded.params, model.params)


def test_an_all_sparse_model_stacks_its_layers_and_round_trips(tmp_path):
    config = toy_moe_config(moe=MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=32))
    assert config.uniform_layers
    model = Model(config, randomized(config))
    assert model.params["layers"]["moe"]["gate_proj"].shape == (3, 4, 64, 32)
    save_pretrained(model, tmp_path)
    loaded = from_pretrained(tmp_path)
    jax.tree.map(np.testing.assert_array_equal, loaded.params, model.params)
    ids = np.array([[1, 5, 9, 200, 17]])
    np.testing.assert_allclose(np.asarray(model(ids)), np.asarray(Model(config, unstack_layers(model.params))(ids)),
                               atol=1e-5)


def test_a_missing_expert_tensor_is_named(tmp_path, golden_dir):
    tensors = load_file(golden_dir / "qwen3_moe_tiny" / "model.safetensors")
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
    save_file(tensors, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text((golden_dir / "qwen3_moe_tiny" / "config.json").read_text())
    with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.2\.mlp\.experts\.5\.up_proj\.weight"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("change, key", [
    ({"num_experts_per_tok": 9}, "experts_per_token"),
    ({"mlp_only_layers": [3]}, "moe.dense_layers"),
    ({"moe_intermediate_size": None}, "moe_intermediate_size"),
])
def test_bad_moe_configs_name_the_key(golden_dir, change, key):
    hf = {**json.loads((golden_dir / "qwen3_moe_tiny" / "config.json").read_text()), **change}
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        ModelConfig.from_hf(hf)


def test_config_counts_every_expert_and_the_active_ones():
    config = toy_moe_config()  # 3 layers, layer 0 dense; 4 experts of width 32, 2 per token
    params = init_params(config, jax.random.key(0))
    assert config.num_params == sum(leaf.size for leaf in jax.tree.leaves(params))
    expert = 3 * config.hidden_size * 32
    assert config.num_params - config.num_active_params == 2 * (4 - 2) * expert
    assert ModelConfig.from_hf(config.to_hf()) == config


# ----------------------------------------------------------------------------- router replay


def test_replaying_the_routers_own_choices_changes_nothing_and_other_choices_do():
    config = toy_moe_config()
    params = randomized(config)
    ids = jnp.array([[1, 5, 9, 200, 17, 3], [4, 5, 6, 0, 0, 0]])
    mask = jnp.array([[1] * 6, [1, 1, 1, 0, 0, 0]])
    logits, routing = forward_with_routing(params, config, ids, attention_mask=mask)
    np.testing.assert_array_equal(np.asarray(forward(params, config, ids, attention_mask=mask,
                                                     expert_ids=routing.expert_ids)), np.asarray(logits))
    other = (routing.expert_ids.astype(jnp.int32) + 1) % config.moe.num_experts
    assert np.abs(np.asarray(forward(params, config, ids, attention_mask=mask, expert_ids=other) - logits)).max() > 1e-3
    for wrong in (other[..., :1], other[:1]):  # too few experts per token; too few sparse layers
        with pytest.raises(ValueError, match="expert_ids: shape"):
            forward(params, config, ids, attention_mask=mask, expert_ids=wrong)
    corrupt = other.at[0, 0, 0, 0].set(7)  # no expert 7: the replay shows NaN, never a silent wrong answer
    assert np.isnan(np.asarray(forward(params, config, ids, attention_mask=mask, expert_ids=corrupt))[0, 0]).all()


def test_gradients_reach_the_router_through_the_replayed_experts():
    config = toy_moe_config(moe=MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=32,
                                          normalize_top_k=False, dense_layers=(0,)))
    params = randomized(config)
    ids = jnp.array([[1, 5, 9, 200, 17, 3]])
    _, routing = jax.jit(forward_with_routing, static_argnums=1)(params, config, ids)
    replayed = (routing.expert_ids.astype(jnp.int32) + 1) % 4

    def router_gradient(expert_ids):
        loss = lambda p: jnp.mean(jax.nn.log_softmax(forward(p, config, ids, expert_ids=expert_ids))[..., 7])
        return jax.jit(jax.grad(loss))(params)["layers_1"]["moe"]["router"]  # one program, not op by op

    gradient = router_gradient(replayed)
    assert np.abs(np.asarray(gradient)).max() > 1e-4
    assert np.abs(np.asarray(gradient - router_gradient(None))).max() > 1e-6  # the replayed experts', not its own


def test_near_tied_routers_flip_under_a_tiny_weight_change_and_replay_restores_the_log_probs():
    """The engine routed with weights theta; the trainer holds theta' = theta + 2e-7 noise on the
    routers (the kind of difference two numerics make). Four experts with near-equal router columns
    flip on that change; replaying the engine's experts gives its log-probs back."""
    moe = MoeConfig(num_experts=4, experts_per_token=1, expert_intermediate_size=32, normalize_top_k=False)
    config = toy_moe_config(moe=moe, num_layers=2)
    engine = randomized(config, scale=0.2)
    router = engine["layers"]["moe"]["router"]  # [layers, hidden, experts]
    tied = router[..., :1] + 1e-7 * jax.random.normal(jax.random.key(5), router.shape)
    engine["layers"]["moe"]["router"] = jnp.broadcast_to(tied, router.shape) + 0.0
    trainer = jax.tree.map(lambda x: x, engine)
    trainer["layers"]["moe"]["router"] = tied + 2e-7 * jax.random.normal(jax.random.key(6), router.shape)

    tokens = jax.random.randint(jax.random.key(7), (4, 24), 3, config.vocab_size)

    @jax.jit  # one program each, not op by op
    def log_probs(params, expert_ids=None):
        logits = forward(params, config, tokens, expert_ids=expert_ids)
        return jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], axis=-1)[..., 0]

    routed = jax.jit(forward_with_routing, static_argnums=1)
    behavior_logits, routing = routed(engine, config, tokens)
    behavior = log_probs(engine)
    _, own = routed(trainer, config, tokens)
    assert (np.asarray(own.expert_ids) != np.asarray(routing.expert_ids)).mean() > 0.2  # the routers flipped
    assert np.abs(np.asarray(log_probs(trainer) - behavior)).max() > 1e-2
    np.testing.assert_allclose(np.asarray(log_probs(trainer, routing.expert_ids)), np.asarray(behavior), atol=1e-5)


def test_cached_decoding_reports_the_routing_of_its_new_tokens():
    config = toy_moe_config()
    params = unstack_layers(randomized(config))
    tokens = jnp.array([[1, 5, 9, 200, 17, 3]])
    _, full = jax.jit(forward_with_routing, static_argnums=1)(params, config, tokens)  # one program each, not op by op
    cache = init_cache(config, 1, 8)
    cached = jax.jit(forward_with_cache, static_argnums=1, static_argnames="with_routing")
    _, cache, prefill = cached(params, config, tokens[:, :5], jnp.arange(5)[None], cache, with_routing=True)
    _, _, step = cached(params, config, tokens[:, 5:], jnp.array([[5]]), cache, with_routing=True)
    np.testing.assert_array_equal(np.concatenate([prefill.expert_ids, step.expert_ids], axis=2), full.expert_ids)


# ----------------------------------------------------------------------------- auxiliary losses


def test_load_balancing_loss_is_one_when_balanced_and_the_expert_count_when_collapsed():
    balanced = Routing(jnp.zeros((1, 1, 10, 2), jnp.uint8), jnp.array([10.0]), jnp.full((1, 4), 5.0),
                       jnp.full((1, 4), 2.5), jnp.array([0.0]))
    collapsed = balanced._replace(expert_counts=jnp.array([[20.0, 0, 0, 0]]), probability_sums=jnp.array([[10.0, 0, 0, 0]]))
    assert float(load_balancing_loss(balanced)) == pytest.approx(1.0)
    assert float(load_balancing_loss(collapsed)) == pytest.approx(4.0)


def test_auxiliary_losses_count_real_tokens_and_add_over_micro_batches():
    config = toy_moe_config()
    params = randomized(config)
    routed = jax.jit(forward_with_routing, static_argnums=1)  # one program per shape, not op by op
    tokens = jax.random.randint(jax.random.key(3), (4, 10), 3, config.vocab_size)
    mask = jnp.ones((4, 10), jnp.int32).at[3, 6:].set(0)
    _, whole = routed(params, config, tokens, attention_mask=mask)
    halves = [routed(params, config, tokens[rows], attention_mask=mask[rows])[1]
              for rows in (slice(0, 2), slice(2, 4))]
    added = jax.tree.map(lambda a, b: a + b, *[h._replace(expert_ids=jnp.zeros(())) for h in halves])
    for loss in (load_balancing_loss, router_z_loss):
        assert float(loss(added)) == pytest.approx(float(loss(whole)), rel=1e-6)
    _, other_padding = routed(params, config, tokens.at[3, 6:].set(9), attention_mask=mask)
    assert float(router_z_loss(other_padding)) == pytest.approx(float(router_z_loss(whole)), rel=1e-6)
    assert float(router_z_loss(whole)) > 0

    def aux(p):
        _, routing = routed(p, config, tokens, attention_mask=mask)
        return load_balancing_loss(routing) + 1e-3 * router_z_loss(routing)

    assert np.abs(np.asarray(jax.grad(aux)(params)["layers_1"]["moe"]["router"])).max() > 0


# ----------------------------------------------------------------------------- expert parallelism


# expert=8 alone in the slow lane: the default lane's data=2 x expert=2 x tensor=2 splits the experts too.
@pytest.mark.parametrize("axes", [pytest.param(dict(expert=8), marks=pytest.mark.slow), dict(data=2, expert=2, tensor=2),
                                  pytest.param(dict(expert=4, tensor=2), marks=pytest.mark.slow),
                                  pytest.param(dict(fsdp=2, expert=4), marks=pytest.mark.slow)])
def test_expert_parallelism_on_8_devices_equals_the_unsharded_forward_and_gradients(axes):
    config = toy_moe_config(moe=MoeConfig(num_experts=8, experts_per_token=2, expert_intermediate_size=32),
                            num_layers=2)
    params = randomized(config)
    tokens = jax.random.randint(jax.random.key(2), (8, 12), 3, config.vocab_size)
    mask = jnp.ones((8, 12), jnp.int32).at[1, 7:].set(0)

    def loss(p, mesh):
        logits, routing = forward_with_routing(p, config, tokens, attention_mask=mask, mesh=mesh)
        chosen = jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[..., None], axis=-1)[..., 0]
        return jnp.sum(chosen * mask) / jnp.sum(mask) + 0.01 * load_balancing_loss(routing), (logits, routing.expert_ids)

    (_, (logits, ids)), grads = jax.jit(jax.value_and_grad(lambda p: loss(p, None), has_aux=True))(params)
    mesh = make_mesh(MeshConfig(**{"fsdp": 1, **axes}))
    sharded = jax.device_put(params, tree_shardings(params, param_logical_axes(config), mesh))
    assert "expert" in sharded["layers"]["moe"]["gate_proj"].sharding.spec
    (_, (logits_ep, ids_ep)), grads_ep = jax.jit(jax.value_and_grad(lambda p: loss(p, mesh), has_aux=True))(sharded)
    np.testing.assert_array_equal(np.asarray(ids_ep), np.asarray(ids))
    # Experts on other devices: the same sums, added in another order.
    assert_reordered_close(np.asarray(logits_ep), np.asarray(logits), decoder_logit_bound(config, tokens.shape[1]))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0), grads_ep, grads)


def test_layers_that_differ_stay_unrolled_through_stack_and_unstack():
    config = toy_moe_config()
    params = init_params(config, jax.random.key(0))
    assert not config.uniform_layers and "layers" not in params
    assert stack_layers(params) is params and unstack_layers(params) is params
    dense = dataclasses.replace(config, moe=None, architecture="qwen3")
    assert "layers" in init_params(dense, jax.random.key(0))


def test_lora_on_a_mixture_adapts_attention_and_names_the_expert_projections_it_cannot():
    from rlax_core.models.lora import init_adapters, merge
    from rlax_core.models.lora_config import LoraConfig

    config = toy_moe_config(moe=MoeConfig(num_experts=4, experts_per_token=2, expert_intermediate_size=32))
    params = randomized(config)
    lora = LoraConfig(rank=2, targets=("q", "o"))
    adapters = jax.tree.map(lambda x: x + 0.1, init_adapters(config, lora, jax.random.key(0)))
    ids = jnp.array([[1, 5, 9, 200]])
    assert np.abs(np.asarray(forward(merge(params, adapters, lora), config, ids) - forward(params, config, ids))).max() > 0
    with pytest.raises(ConfigError, match="gate/up/down"):
        init_adapters(config, LoraConfig(rank=2), jax.random.key(0))
