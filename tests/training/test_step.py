import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlax_core.data.rollout_store import RolloutStore
from rlax_core.models.config import toy_config
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rl.presets import get_preset
from rlax_core.training.batching import make_batch
from rlax_core.parallel import MeshConfig, make_mesh
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.logprobs import token_logprobs
from rlax_core.training.step import Trainer

from training_helpers import write_random_groups

MODEL = toy_config()
# A large Adam eps: the first Adam step is lr * g / (|g| + eps), which turns float noise in a
# near-zero gradient into a full lr-sized step; eps = 1e-4 keeps the comparison about the math.
OPTIMIZER = OptimizerConfig(learning_rate=1e-3, eps=1e-4)


def batch_from_store(tmp_path, groups=4, samples=4, row_multiple=1):
    store = RolloutStore(tmp_path, run="t")
    write_random_groups(store, [0], groups_per_step=groups, samples=samples)
    return make_batch([store.read_group(k) for k in store.list_groups()], max_seq_len=16, row_multiple=row_multiple)


def trainer(mesh_config=MeshConfig(), algorithm=AlgorithmConfig(), **overrides):
    config = TrainerConfig(max_seq_len=16, mesh=mesh_config, optimizer=OPTIMIZER, **overrides)
    return Trainer(MODEL, algorithm, config, make_mesh(config.mesh, jax.devices()[: _devices(mesh_config)]))


def _devices(mesh_config):
    return max(1, mesh_config.data) * max(1, mesh_config.fsdp) * max(1, mesh_config.tensor)


def test_batch_layout_aligns_completion_tokens_with_their_predictions(tmp_path):
    batch = batch_from_store(tmp_path, groups=2, samples=3, row_multiple=4)
    assert batch["tokens"].shape == (8, 16) and batch["loss_mask"].shape == (8, 15)
    assert batch["sample_mask"].tolist() == [1] * 6 + [0] * 2
    assert batch["group_ids"].tolist() == [0, 0, 0, 1, 1, 1, -1, -1]
    # prompt 5 + completion 6: predictions of positions 4..9 are completion tokens 5..10
    assert batch["loss_mask"][0].nonzero()[0].tolist() == list(range(4, 10))
    assert batch["attention_mask"][0].sum() == 11


@pytest.mark.slow
def test_first_update_is_on_policy_and_micro_batches_add_up(tmp_path):
    batch = batch_from_store(tmp_path, groups=4, samples=4)
    whole, split = trainer(micro_batches=1), trainer(micro_batches=4)
    params = whole.init_state().params
    state_a, metrics_a = whole.step(whole.init_state(params), batch)
    state_b, metrics_b = split.step(split.init_state(params), batch)
    assert float(metrics_a["ratio_min"]) == float(metrics_a["ratio_max"]) == 1.0  # pi / pi_old, exactly
    assert float(metrics_a["approx_kl_old"]) == 0.0
    np.testing.assert_allclose(float(metrics_a["loss"]), float(metrics_b["loss"]), atol=1e-6)
    np.testing.assert_allclose(float(metrics_a["grad_norm"]), float(metrics_b["grad_norm"]), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), state_a.params, state_b.params)
    assert int(state_a.step) == 1 and not np.array_equal(state_a.rng, whole.init_state(params).rng)


@pytest.mark.slow
@pytest.mark.parametrize("mesh_config, algorithm, updates", [
    (MeshConfig(fsdp=2, tensor=4), AlgorithmConfig(), {}),
    (MeshConfig(data=2, fsdp=2, tensor=2), AlgorithmConfig(), {}),
    # PPO: a critic sharded by the same rules, the KL in the reward, 2 epochs x 2 mini-batches.
    (MeshConfig(fsdp=2, tensor=4), get_preset("ppo"), dict(ppo_epochs=2, mini_batches=2)),
], ids=["fsdp2-tensor4", "data2-fsdp2-tensor2", "ppo-fsdp2-tensor4"])
def test_sharded_step_equals_unsharded(tmp_path, mesh_config, algorithm, updates):
    assert len(jax.devices()) == 8, "conftest simulates 8 CPU devices"
    batch = batch_from_store(tmp_path, groups=4, samples=4)
    single = trainer(MeshConfig(fsdp=1), algorithm, **updates)
    sharded = trainer(mesh_config, algorithm, micro_batches=2, **updates)
    params = single.init_state().params
    reference = jax.tree.map(np.asarray, params) if algorithm.uses_reference else None  # host: each mesh places it
    state_1, metrics_1 = single.step(single.init_state(params), batch, reference)
    state_8, metrics_8 = sharded.step(sharded.init_state(params), batch, reference)
    embedding = state_8.params["embed_tokens"]["embedding"]
    assert len(embedding.sharding.device_set) == 8 and not embedding.sharding.is_fully_replicated
    np.testing.assert_allclose(float(metrics_1["loss"]), float(metrics_8["loss"]), rtol=1e-5, atol=1e-7)
    trained = lambda state: (state.params, state.value_params)
    if algorithm.uses_values:
        critic_embedding = state_8.value_params["backbone"]["embed_tokens"]["embedding"]
        assert len(critic_embedding.sharding.device_set) == 8 and not critic_embedding.sharding.is_fully_replicated
        np.testing.assert_allclose(float(metrics_1["value_loss"]), float(metrics_8["value_loss"]), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6),
                 trained(state_1), trained(state_8))


@pytest.mark.slow
def test_kl_to_reference_is_computed_in_the_graph(tmp_path):
    batch = batch_from_store(tmp_path)
    kl = trainer(algorithm=AlgorithmConfig(kl_coef=0.1))
    state = kl.init_state()
    with pytest.raises(ValueError, match="needs ref_params"):
        kl.step(state, batch)
    reference = jax.tree.map(jnp.copy, state.params)
    state, metrics = kl.step(state, batch, ref_params=reference)
    assert float(metrics["kl_ref"]) < 1e-9  # the policy is the reference before its first step
    state, metrics = kl.step(state, batch, ref_params=reference)
    assert float(metrics["kl_ref"]) > 0.0


@pytest.mark.slow
def test_bfloat16_parameters_keep_float32_log_probs(tmp_path):
    batch = batch_from_store(tmp_path)
    bf16 = trainer(param_dtype="bfloat16")
    state, metrics = bf16.step(bf16.init_state(), batch)
    assert state.params["embed_tokens"]["embedding"].dtype == jnp.bfloat16
    logprobs, _ = token_logprobs(state.params, MODEL, jnp.asarray(batch["tokens"]), jnp.asarray(batch["attention_mask"]))
    assert logprobs.dtype == jnp.float32 and np.isfinite(float(metrics["loss"]))


@pytest.mark.slow
def test_unrolled_layers_take_the_same_step_as_the_scan(tmp_path):
    batch = batch_from_store(tmp_path)
    algorithm = get_preset("ppo")  # policy, critic and reference all run through the layer layout
    scanned = trainer(algorithm=algorithm, mini_batches=2, micro_batches=2)
    unrolled = trainer(algorithm=algorithm, mini_batches=2, micro_batches=2, scan_layers=False)
    params = scanned.init_state().params
    reference = jax.tree.map(np.asarray, params)
    state_a, metrics_a = scanned.step(scanned.init_state(params), batch, reference)
    state_b, metrics_b = unrolled.step(unrolled.init_state(params), batch, reference)
    assert jax.tree.structure(state_a) == jax.tree.structure(state_b)  # the state keeps the stacked layout
    np.testing.assert_allclose(float(metrics_a["loss"]), float(metrics_b["loss"]), rtol=1e-5, atol=1e-7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
                 (state_a.params, state_a.value_params, state_a.opt_state),
                 (state_b.params, state_b.value_params, state_b.opt_state))


@pytest.mark.slow  # two trainers compiled: ~25 s on an idle 2-core machine
def test_gfpo_learns_from_its_retained_completions_as_grpo_does_from_them_alone(tmp_path):
    # GFPO (Shrivastava et al. 2025, eq. 3) is GRPO over the retained subset S of each group, its
    # token-mean taken over S's tokens: the filtered-out completions add nothing, not even tokens.
    batch = batch_from_store(tmp_path, groups=2, samples=4)
    lengths = [6, 3, 5, 2, 4, 6, 1, 5]
    for row, length in enumerate(lengths):
        first = int(batch["loss_mask"][row].nonzero()[0][0])
        batch["loss_mask"][row, first + length:] = 0.0
    gfpo = dataclasses.replace(get_preset("gfpo"), group_filter_keep=2)
    grpo = dataclasses.replace(gfpo, name="grpo-on-S", group_filter="none", group_filter_keep=0)
    retained = [1, 3, 4, 6]  # the two shortest of each group
    alone = {name: array[retained] for name, array in batch.items()}
    filtered, plain = trainer(algorithm=gfpo), trainer(algorithm=grpo)
    params = filtered.init_state().params
    state_a, metrics_a = filtered.step(filtered.init_state(params), batch)
    state_b, metrics_b = plain.step(plain.init_state(params), alone)
    np.testing.assert_allclose(float(metrics_a["loss"]), float(metrics_b["loss"]), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(metrics_a["grad_norm"]), float(metrics_b["grad_norm"]), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), state_a.params, state_b.params)


def test_a_step_compiled_ahead_leaves_the_state_and_the_update_as_they_were(tmp_path):
    batch = batch_from_store(tmp_path, groups=2, samples=3, row_multiple=2)
    ahead, plain = trainer(micro_batches=2), trainer(micro_batches=2)
    params = plain.init_state().params
    state = ahead.init_state(params)
    ahead.compile_step(state, rollouts=6)  # lowered and compiled for the batch's shapes, nothing run
    assert int(state.step) == 0  # read for its shapes only: not donated, still usable
    state_a, metrics_a = ahead.step(state, batch)
    state_b, metrics_b = plain.step(plain.init_state(params), batch)
    assert float(metrics_a["loss"]) == float(metrics_b["loss"])
    jax.tree.map(np.testing.assert_array_equal, state_a.params, state_b.params)
    with pytest.raises(ValueError, match="ref_params"):
        trainer(algorithm=get_preset("grpo")).compile_step(state_b, rollouts=6)


# seq_mean_token_mean in the slow lane: the default lane's test_packing.py::
# test_micro_batches_and_data_shards_take_the_padded_batches_loss_and_gradient steps GRPO's
# seq_mean_token_mean with gradients summed on each of 2 devices over 2 micro-batches.
@pytest.mark.parametrize("aggregation", ["token_mean", pytest.param("seq_mean_token_mean", marks=pytest.mark.slow)])
def test_gradients_summed_on_each_device_take_the_partitioned_step(tmp_path, aggregation):
    # Pure data parallelism accumulates each device's gradients and reduces them once per update; the
    # loss, the gradient and the new weights are those of XLA's partitioning, which reduces per micro-batch.
    batch = batch_from_store(tmp_path, groups=4, samples=4)
    algorithm = dataclasses.replace(get_preset("grpo"), loss_aggregation=aggregation, kl_coef=0.0)
    on_device, partitioned = (trainer(MeshConfig(data=2, fsdp=1), algorithm, micro_batches=2) for _ in range(2))
    partitioned.accumulate_on_device = False  # read when the step is first traced
    assert on_device.accumulate_on_device
    assert not trainer(MeshConfig(data=2, fsdp=2), algorithm).accumulate_on_device  # FSDP's gradients stay sharded
    params = on_device.init_state().params
    state_a, metrics_a = on_device.step(on_device.init_state(params), batch)
    state_b, metrics_b = partitioned.step(partitioned.init_state(params), batch)
    np.testing.assert_allclose(float(metrics_a["loss"]), float(metrics_b["loss"]), rtol=0, atol=1e-6)
    np.testing.assert_allclose(float(metrics_a["grad_norm"]), float(metrics_b["grad_norm"]), rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7),
                 state_a.params, state_b.params)


@pytest.mark.slow
def test_ppo_with_gradients_summed_on_each_device_equals_unsharded(tmp_path):
    # The critic's gradients too, over 2 epochs x 2 mini-batches x 2 micro-batches on 4 devices.
    batch = batch_from_store(tmp_path, groups=4, samples=4)
    algorithm, updates = get_preset("ppo"), dict(ppo_epochs=2, mini_batches=2)
    single = trainer(MeshConfig(fsdp=1), algorithm, **updates)
    data_parallel = trainer(MeshConfig(data=4, fsdp=1), algorithm, micro_batches=2, **updates)
    assert data_parallel.accumulate_on_device
    params = single.init_state().params
    reference = jax.tree.map(np.asarray, params)
    state_1, metrics_1 = single.step(single.init_state(params), batch, reference)
    state_4, metrics_4 = data_parallel.step(data_parallel.init_state(params), batch, reference)
    for name in ("loss", "value_loss"):
        np.testing.assert_allclose(float(metrics_1[name]), float(metrics_4[name]), rtol=1e-5, atol=1e-7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6),
                 (state_1.params, state_1.value_params), (state_4.params, state_4.value_params))


@pytest.mark.parametrize("scan_layers", [pytest.param(True, marks=pytest.mark.slow), False])
def test_fused_projections_take_the_same_step_as_separate_ones(tmp_path, scan_layers):
    # Whole weights on each device: q/k/v (with their biases) and gate/up run as one product each in
    # the policy, the reference and the critic's backbone; the gradients go back to separate weights.
    batch = batch_from_store(tmp_path, groups=4, samples=4)
    algorithm = get_preset("ppo")  # a critic, and the KL to the reference in the reward
    fused, separate = (trainer(MeshConfig(data=2, fsdp=1), algorithm, micro_batches=2, scan_layers=scan_layers,
                               projections=layout) for layout in ("auto", "separate"))
    assert fused.fuse_projections and not separate.fuse_projections  # auto: fused on CPU
    assert not trainer(MeshConfig(data=1, fsdp=2), algorithm).fuse_projections  # FSDP shards the weights
    with pytest.raises(ValueError, match="trainer.projections=fused needs whole weights"):
        trainer(MeshConfig(data=1, fsdp=2), algorithm, projections="fused")
    params = fused.init_state().params
    reference = jax.tree.map(np.asarray, params)
    state_a, metrics_a = fused.step(fused.init_state(params), batch, reference)
    state_b, metrics_b = separate.step(separate.init_state(params), batch, reference)
    for name in ("loss", "value_loss", "reward_kl"):
        np.testing.assert_allclose(float(metrics_a[name]), float(metrics_b[name]), rtol=0, atol=1e-6)
    assert jax.tree.structure(state_a.params) == jax.tree.structure(state_b.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7),
                 (state_a.params, state_a.value_params), (state_b.params, state_b.value_params))
