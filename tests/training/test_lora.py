"""LoRA in the trainer: the update differentiates the adapted model and moves only the adapters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.config import ConfigError
from rlax_core.models.config import toy_config
from rlax_core.models.lora import adapter_shapes, init_adapters, merge
from rlax_core.models.lora_config import TARGETS, LoraConfig
from rlax_core.models.transformer import forward, init_params
from rlax_core.parallel import MeshConfig, make_mesh
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rl.objective import policy_loss
from rlax_core.training.checkpoint import Checkpointer
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.ledger import DataLedger
from rlax_core.training.logprobs import token_logprobs
from rlax_core.training.step import Trainer

from test_step import batch_from_store
from tests.support.tolerances import assert_reordered_close, decoder_logit_bound, decoder_logprob_bound

MODEL = toy_config()
LORA = LoraConfig(rank=4, alpha=8.0)
# Adam's first step is -lr * g / (|g| + eps): with lr = eps = 1e4 it is -g / (1 + |g| / 1e4), so the
# adapters' change after one update reads back their gradient to about 1e-4 relative.
GRADIENT_READOUT = OptimizerConfig(learning_rate=1e4, eps=1e4, max_grad_norm=None)


def lora_trainer(lora=LORA, optimizer=GRADIENT_READOUT, mesh=MeshConfig(fsdp=1), **overrides):
    config = TrainerConfig(max_seq_len=16, mesh=mesh, optimizer=optimizer, lora=lora, **overrides)
    devices = jax.devices()[: max(1, mesh.data) * max(1, mesh.fsdp) * max(1, mesh.tensor)]
    return Trainer(MODEL, AlgorithmConfig(), config, make_mesh(config.mesh, devices))


def random_adapters(seed=1):
    """Adapters with B != 0 too (fresh ones have B = 0, where A's gradient is exactly zero)."""
    keys = iter(jax.random.split(jax.random.key(seed), 64))
    return jax.tree.map(lambda x: 0.05 * jax.random.normal(next(keys), x.shape), init_adapters(MODEL, LORA, next(keys)))


def hand_merged(base, adapters):
    """W + alpha / rank * A @ B, layer by layer, written out for each target without lora.py."""
    merged = jax.tree.map(lambda x: x, base)
    for module, projections in adapters["layers"].items():
        for proj, ab in projections.items():
            kernel = base["layers"][module][proj]["kernel"]
            layers = []
            for i in range(MODEL.num_layers):
                a, b = ab["lora_a"][i], ab["lora_b"][i]
                a2, b2 = a.reshape(-1, LORA.rank), b.reshape(LORA.rank, -1)
                layers.append(kernel[i] + (LORA.alpha / LORA.rank) * (a2 @ b2).reshape(kernel.shape[1:]))
            merged["layers"][module][proj]["kernel"] = jnp.stack(layers)
    return merged


def test_config_is_validated_on_construction():
    assert not LoraConfig().enabled and LoraConfig(rank=8).scale == 16.0 / 8
    for bad in (dict(rank=-1), dict(rank=4, alpha=0), dict(rank=4, targets=("q", "qkv")), dict(rank=4, targets=()),
                dict(rank=4, dropout=1.0), dict(rank=4, dropout=-0.1), dict(rank=4, targets=("q", "q"))):
        with pytest.raises(ConfigError):
            LoraConfig(**bad)


def test_fresh_adapters_leave_the_model_unchanged_and_merge_equals_the_hand_sum():
    base = init_params(MODEL, jax.random.key(0))
    ids = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % MODEL.vocab_size
    fresh = init_adapters(MODEL, LORA, jax.random.key(1))
    np.testing.assert_array_equal(forward(merge(base, fresh, LORA), MODEL, ids), forward(base, MODEL, ids))
    adapters = random_adapters()
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6),
                 merge(base, adapters, LORA), hand_merged(base, adapters))
    shapes = adapter_shapes(MODEL, LORA)
    assert shapes["o"] == ((MODEL.num_layers, MODEL.num_heads, MODEL.head_dim, 4), (MODEL.num_layers, 4, MODEL.hidden_size))


@pytest.mark.parametrize("scan_layers", [True, False], ids=["scanned", "unrolled"])
def test_lora_step_equals_autodiff_of_the_hand_adapted_model_and_keeps_the_base(tmp_path, scan_layers):
    batch = batch_from_store(tmp_path, groups=2, samples=4)
    trainer = lora_trainer(scan_layers=scan_layers)
    base = init_params(MODEL, jax.random.key(0))
    base_before = jax.tree.map(np.array, base)
    adapters = random_adapters()
    state = trainer.init_state(base).replace(params=adapters)
    prepared = jax.device_get(trainer.prepare_batch(state, batch))

    def reference_loss(adapters):
        logprobs, entropy = token_logprobs(hand_merged(base, adapters), MODEL, jnp.asarray(batch["tokens"]),
                                           jnp.asarray(batch["attention_mask"]))
        loss, _ = policy_loss(trainer.algorithm, logprobs, jax.lax.stop_gradient(logprobs), prepared["advantages"],
                              prepared["policy_mask"], behavior_logprobs=jnp.asarray(batch["behavior_logprobs"]),
                              entropy=jax.lax.stop_gradient(entropy))
        return loss

    expected_loss, expected_grads = jax.jit(jax.value_and_grad(reference_loss))(adapters)  # one program, not op by op
    adapters_before = jax.tree.map(np.array, adapters)
    state, metrics = trainer.step(state, batch)
    np.testing.assert_allclose(float(metrics["loss"]), float(expected_loss), rtol=1e-5, atol=1e-7)
    read_grads = jax.tree.map(lambda before, after: before - np.asarray(after), adapters_before, state.params)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(expected_grads))
    assert scale > 1e-4  # the comparison is about real gradients on A and B alike
    jax.tree.map(lambda got, want: np.testing.assert_allclose(got, want, atol=2e-3 * scale), read_grads, expected_grads)
    # The state holds the adapters only; the base the trainer holds is bit for bit what it was given.
    assert jax.tree.structure(state.params) == jax.tree.structure(adapters)
    state, _ = trainer.step(state, batch)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(trainer.base), base_before)


def test_optimizer_state_and_checkpoint_hold_only_the_adapters_and_resume_exactly(tmp_path):
    batch = batch_from_store(tmp_path / "rollouts", groups=2, samples=4)
    optimizer = OptimizerConfig(learning_rate=1e-2)
    base = init_params(MODEL, jax.random.key(0))
    trainer = lora_trainer(optimizer=optimizer)
    state = trainer.init_state(base)
    adapter_count = sum(x.size for x in jax.tree.leaves(state.params))
    moment_count = sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim > 0)
    assert moment_count == 2 * adapter_count < sum(x.size for x in jax.tree.leaves(base)) / 2
    state, _ = trainer.step(state, batch)
    checkpointer = Checkpointer(tmp_path / "ckpt", async_save=False)
    checkpointer.save(1, state, DataLedger())
    checkpointer.close()
    expected, _ = trainer.step(state, batch)

    resumed_trainer = lora_trainer(optimizer=optimizer)
    resumed_trainer.load_base(base)
    restored, _ = Checkpointer(tmp_path / "ckpt").restore(1, resumed_trainer.abstract_state())
    resumed, _ = resumed_trainer.step(restored, batch)
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.params), jax.device_get(expected.params))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.opt_state), jax.device_get(expected.opt_state))


@pytest.mark.slow
def test_sharded_lora_step_equals_unsharded(tmp_path):
    batch = batch_from_store(tmp_path, groups=4, samples=4)
    optimizer = OptimizerConfig(learning_rate=1e-2, eps=1e-4)  # see test_step.OPTIMIZER: no sign-of-noise steps
    base = init_params(MODEL, jax.random.key(0))
    single, sharded = lora_trainer(optimizer=optimizer), lora_trainer(optimizer=optimizer, mesh=MeshConfig(fsdp=2, tensor=4))
    state_1, metrics_1 = single.step(single.init_state(base).replace(params=random_adapters()), batch)
    state_8, metrics_8 = sharded.step(sharded.init_state(base).replace(params=random_adapters()), batch)
    np.testing.assert_allclose(float(metrics_1["loss"]), float(metrics_8["loss"]), atol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), jax.device_get(state_1.params),
                 jax.device_get(state_8.params))
    b_spec = sharded.param_shardings["layers"]["attn"]["q_proj"]["lora_b"].spec
    assert "tensor" in tuple(b_spec)  # B's heads axis shards like q_proj's kernel


def test_on_the_fly_adapters_equal_the_merged_kernels_and_dropout_zero_drops_nothing():
    from rlax_core.models.lora import scaled, with_adapters

    base = init_params(MODEL, jax.random.key(0))
    ids = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % MODEL.vocab_size
    adapters = random_adapters()
    merged = forward(merge(base, adapters, LORA), MODEL, ids)
    on_the_fly = with_adapters(base, scaled(adapters, LORA))
    # Not bit-identical: x @ W + (x @ A) @ B rounds twice where x @ W' rounds once.
    assert_reordered_close(forward(on_the_fly, MODEL, ids), merged, decoder_logit_bound(MODEL, context=6))
    np.testing.assert_array_equal(forward(on_the_fly, MODEL, ids, lora_dropout=0.0, lora_dropout_rng=jax.random.key(1)),
                                  forward(on_the_fly, MODEL, ids))
    dropped = forward(on_the_fly, MODEL, ids, lora_dropout=0.5, lora_dropout_rng=jax.random.key(1))
    assert float(jnp.max(jnp.abs(dropped - merged))) > 1e-3


def test_lora_dropout_changes_the_gradients_reproducibly(tmp_path):
    batch = batch_from_store(tmp_path, groups=2, samples=4)
    base = init_params(MODEL, jax.random.key(0))

    def one_step(dropout, seed=0):
        trainer = lora_trainer(lora=LoraConfig(rank=4, alpha=8.0, dropout=dropout), seed=seed)
        state, metrics = trainer.step(trainer.init_state(base).replace(params=random_adapters()), batch)
        return jax.device_get(state.params), float(metrics["loss"])

    plain, _ = one_step(0.0)
    dropped, dropped_loss = one_step(0.3)
    again, again_loss = one_step(0.3)
    other_seed, _ = one_step(0.3, seed=1)
    # The same step seed draws the same masks: bit for bit the same update.
    jax.tree.map(np.testing.assert_array_equal, dropped, again)
    assert dropped_loss == again_loss
    differs = lambda x, y: max(float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y)))
    assert differs(dropped, plain) > 1e-3 and differs(dropped, other_seed) > 1e-3


def test_an_int8_base_stays_close_to_the_float_base_and_training_moves_only_the_adapters(tmp_path):
    from rlax_core.models.lora import dequantize_kernels, quantize_kernels

    base = init_params(MODEL, jax.random.key(0))
    quantized = quantize_kernels(base)
    kernel = quantized["layers"]["mlp"]["down_proj"]
    assert kernel["kernel"].dtype == jnp.int8 and kernel["kernel_scale"].shape == (MODEL.num_layers, MODEL.hidden_size)
    # Per output channel, half a quantization step at most: |W - q s| <= s / 2.
    for (module, proj), _, _ in TARGETS.values():
        error = jnp.abs(dequantize_kernels(quantized)["layers"][module][proj]["kernel"] - base["layers"][module][proj]["kernel"])
        assert float(jnp.max(error)) <= float(jnp.max(quantized["layers"][module][proj]["kernel_scale"])) / 2 + 1e-7
    ids = jnp.arange(24, dtype=jnp.int32).reshape(2, 12) % MODEL.vocab_size
    logprobs = jax.jit(lambda params: jax.nn.log_softmax(forward(params, MODEL, ids)))  # one program, not op by op
    # The stated tolerance: log-probs within 1e-2 of the float base's (0.005 of 127 steps per channel).
    np.testing.assert_allclose(logprobs(quantized), logprobs(base), atol=1e-2)
    # Scaled after the product against before it: the same sums, rounded in another order.
    assert_reordered_close(logprobs(quantized), logprobs(dequantize_kernels(quantized)),
                           decoder_logprob_bound(MODEL, context=12))

    batch = batch_from_store(tmp_path, groups=2, samples=4)
    trainer = lora_trainer(lora=LoraConfig(rank=4, alpha=8.0, base_dtype="int8"),
                           optimizer=OptimizerConfig(learning_rate=1e-2))
    state = trainer.init_state(base).replace(params=random_adapters())
    held = jax.tree.map(np.array, jax.device_get(trainer.base))
    assert held["layers"]["attn"]["q_proj"]["kernel"].dtype == np.int8
    adapters_before = jax.tree.map(np.array, state.params)
    state, metrics = trainer.step(state, batch)
    assert np.isfinite(float(metrics["loss"]))
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(trainer.base), held)  # the int8 base is untouched
    moved = [float(np.max(np.abs(a - np.asarray(b)))) for a, b in zip(jax.tree.leaves(adapters_before),
                                                                      jax.tree.leaves(state.params))]
    assert min(moved) > 0  # every adapter tensor learned
    # Exports and full versions take the dequantized base with the adapters merged, in float.
    policy = trainer.policy_params(state.params)
    assert policy["layers"]["attn"]["q_proj"]["kernel"].dtype == jnp.float32 and "kernel_scale" not in policy["layers"]["attn"]["q_proj"]


def test_rlax_compiles_update_is_built_from_shapes_alone_and_is_the_program_step_runs(tmp_path):
    """``rlax compile``'s trainer program for a QLoRA policy with a KL term, lowered from the abstract
    state and the abstract int8 base (nothing loaded), is the program ``step`` runs on real ones
    (the base as the frozen weights and as the reference policy)."""
    from rlax_core.compile.programs import trainer_programs

    algorithm = AlgorithmConfig(kl_coef=0.1)
    config = TrainerConfig(max_seq_len=16, mesh=MeshConfig(fsdp=1), optimizer=OptimizerConfig(learning_rate=1e-2),
                           lora=LoraConfig(rank=4, alpha=8.0, base_dtype="int8"))
    (program,) = trainer_programs(MODEL, algorithm, config, jax.devices()[:1], rows_per_step=8)
    compiled_from_shapes = program.lower().as_text()

    trainer = Trainer(MODEL, algorithm, config, make_mesh(config.mesh, jax.devices()[:1]))
    state = trainer.init_state(init_params(MODEL, jax.random.key(0)))
    batch = trainer.put_batch(batch_from_store(tmp_path, groups=2, samples=4))
    # step's call: trainer._step(state, batch, ref_params (LoRA: the base), base)
    assert compiled_from_shapes == trainer._step.lower(state, batch, trainer.base, trainer.base).as_text()
    without_kl = trainer_programs(MODEL, AlgorithmConfig(), config, jax.devices()[:1], rows_per_step=8)[0]
    assert without_kl.lower().as_text() != compiled_from_shapes  # the reference policy's forward is in it
