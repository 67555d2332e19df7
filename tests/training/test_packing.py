"""Packed rows: the same update as padded rows, for every preset, multi-turn masks and LoRA;
segments that cannot see each other; the lanes' layout; and bucketed shapes that bound the compiles."""

import jax
import numpy as np
import pytest

from rlax_core.data.records import ROLLOUT_SCHEMA, to_table
from rlax_core.models.config import toy_config
from rlax_core.models.lora import init_adapters
from rlax_core.models.lora_config import LoraConfig
from rlax_core.models.transformer import init_params
from rlax_core.parallel import MeshConfig, make_mesh
from rlax_core.rl.presets import PRESETS, get_preset
from rlax_core.training.batching import make_batch
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.logprobs import token_logprobs
from rlax_core.training.packing import bucket, pack_batch, real_tokens
from rlax_core.training.step import Trainer

MODEL = toy_config()
MAX_SEQ_LEN = 32
# Adam's first step is -lr * g / (|g| + eps): with lr = eps = 1e4 the parameters' change after one
# update reads back their gradient (to about 1e-4 relative), so equal updates mean equal gradients.
GRADIENT_READOUT = OptimizerConfig(learning_rate=1e4, eps=1e4, max_grad_norm=None)


def long_tail_groups(seed=0, groups=4, samples=4, episodes=False):
    """Groups whose prompts and completions vary in length (most short, a few near the cap)."""
    rng = np.random.default_rng(seed)
    tables = []
    for g in range(groups):
        prompt = rng.integers(3, 256, rng.integers(2, 7)).tolist()
        rows = []
        for s in range(samples):
            length = int(min(MAX_SEQ_LEN - len(prompt), 1 + rng.exponential(6)))
            completion = rng.integers(3, 256, length).tolist()
            row = dict(example_id=f"e{g}", group_id=f"g{g}", sample_idx=s, policy_version=0, seed=s,
                       prompt_ids=prompt, completion_ids=completion,
                       behavior_logprobs=(-rng.random(length) * 4).tolist(), finish_reason="length",
                       reward=float(rng.random()), reward_info="{}")
            if episodes:  # a multi-turn episode: observation tokens are context, not trained on
                row["policy_mask"] = rng.integers(0, 2, length).tolist()
            rows.append(row)
        tables.append(to_table(rows, ROLLOUT_SCHEMA))
    return tables


def trainer(algorithm, mesh=MeshConfig(fsdp=1), **overrides):
    config = TrainerConfig(max_seq_len=MAX_SEQ_LEN, mesh=mesh, optimizer=GRADIENT_READOUT, **overrides)
    devices = jax.devices()[: max(1, mesh.data) * max(1, mesh.fsdp) * max(1, mesh.tensor)]
    return Trainer(MODEL, algorithm, config, make_mesh(config.mesh, devices))


def padded_and_packed(tables, update, row_tokens=MAX_SEQ_LEN):
    padded = make_batch(tables, max_seq_len=MAX_SEQ_LEN, row_multiple=update.row_multiple)
    packed = pack_batch(padded, row_tokens=row_tokens, lanes=update.lanes, devices=update.batch_shards)
    return padded, packed


def assert_same_update(update, padded, packed, ref_params=None, make_state=None):
    params = update.init_state().params
    make_state = make_state or (lambda: update.init_state(params))
    state_a, metrics_a = update.step(make_state(), padded, ref_params)
    state_b, metrics_b = update.step(make_state(), packed, ref_params)
    assert metrics_a.keys() == metrics_b.keys()
    for name in metrics_a:
        np.testing.assert_allclose(float(metrics_b[name]), float(metrics_a[name]), atol=1e-6, rtol=1e-6, err_msg=name)
    # The trained parameters (policy and critic) read back the gradients (GRADIENT_READOUT).
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-6, rtol=1e-6),
                 (state_a.params, state_a.value_params), (state_b.params, state_b.value_params))


@pytest.mark.slow
@pytest.mark.parametrize("preset", [name if name in ("grpo", "ppo") else pytest.param(name, marks=pytest.mark.long)
                                    for name in PRESETS.names()])  # one group-relative, one with a critic; the rest: long
def test_a_packed_update_equals_the_padded_one_for_every_preset(preset):
    algorithm = get_preset(preset)
    # Two epochs: pi_old is then computed apart (the prepared forward on packed rows) and the ratio moves.
    update = trainer(algorithm, ppo_epochs=2)
    padded, packed = padded_and_packed(long_tail_groups(), update)
    assert packed["tokens"].shape[0] < padded["tokens"].shape[0]  # it did pack
    reference = update.init_state().params if algorithm.uses_reference else None
    assert_same_update(update, padded, packed, ref_params=reference)


@pytest.mark.slow
def test_multi_turn_masks_and_lora_train_packed_as_padded():
    lora = LoraConfig(rank=4, alpha=8.0)
    update = trainer(get_preset("grpo"), lora=lora)
    base = init_params(MODEL, jax.random.key(0))
    keys = iter(jax.random.split(jax.random.key(1), 64))  # B != 0 too, so every adapter has a gradient
    adapters = jax.tree.map(lambda x: np.asarray(0.05 * jax.random.normal(next(keys), x.shape)),
                            init_adapters(MODEL, lora, next(keys)))  # host arrays: each step donates its state
    padded, packed = padded_and_packed(long_tail_groups(episodes=True), update)
    assert set(np.unique(padded["loss_mask"])) == {0.0, 1.0} and padded["loss_mask"].sum() < padded["attention_mask"].sum()
    assert_same_update(update, padded, packed, make_state=lambda: update.init_state(base).replace(params=adapters))


@pytest.mark.slow
def test_micro_batches_and_data_shards_take_the_padded_batches_loss_and_gradient():
    """Lanes (2 devices x 2 micro-batches) hold other samples than the padded micro-batches, so
    per-micro-batch means differ; the loss and the gradient are the batch's under any split."""
    algorithm = get_preset("grpo", kl_coef=0.0)
    whole = trainer(algorithm)
    split = trainer(algorithm, mesh=MeshConfig(data=2, fsdp=1), micro_batches=2)
    assert split.accumulate_on_device and algorithm.loss_aggregation == "seq_mean_token_mean"  # test_step.py leans on both
    tables = long_tail_groups(groups=6)
    padded = make_batch(tables, max_seq_len=MAX_SEQ_LEN)
    packed = pack_batch(padded, row_tokens=MAX_SEQ_LEN, lanes=split.lanes, devices=split.batch_shards)
    params = whole.init_state().params
    state_a, metrics_a = whole.step(whole.init_state(params), padded)
    state_b, metrics_b = split.step(split.init_state(params), packed)
    for name in ("loss", "grad_norm", "reward_mean", "num_tokens", "completion_length_mean"):
        np.testing.assert_allclose(float(metrics_b[name]), float(metrics_a[name]), rtol=1e-5, atol=1e-6, err_msg=name)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-4, atol=1e-5),
                 state_a.params, state_b.params)


def test_changing_one_segment_changes_no_other_segments_log_probs():
    update = trainer(get_preset("grpo"))
    _, packed = padded_and_packed(long_tail_groups(groups=6), update)
    segments = packed["segment_ids"]
    row = int(np.argmax(segments.max(axis=1)))  # the row holding the most segments
    assert segments[row].max() >= 3
    params = update.init_state().params

    def logprobs(tokens):
        out, _ = token_logprobs(params, MODEL, tokens[row:row + 1], segment_ids=segments[row:row + 1],
                                positions=packed["positions"][row:row + 1])
        return np.asarray(out[0])

    changed = packed["tokens"].copy()
    second = segments[row] == 2
    changed[row, second] = (changed[row, second] + 17) % MODEL.vocab_size
    before, after = logprobs(packed["tokens"]), logprobs(changed)
    # Position t predicts t + 1: a position of segment k whose target is in segment k too.
    for segment in range(1, segments[row].max() + 1):
        inside = (segments[row, :-1] == segment) & (segments[row, 1:] == segment)
        if segment == 2:
            assert not np.allclose(before[inside], after[inside])
        else:
            np.testing.assert_array_equal(before[inside], after[inside])


def test_rows_fill_by_first_fit_decreasing_and_lanes_balance_by_tokens():
    padded = make_batch(long_tail_groups(groups=16), max_seq_len=MAX_SEQ_LEN)
    packed = pack_batch(padded, row_tokens=64, lanes=4, devices=2)
    assert real_tokens(packed) == real_tokens(padded)
    # Positions restart in each segment; segments are contiguous and numbered from 1 in row order.
    for segments, positions in zip(packed["segment_ids"], packed["positions"]):
        for segment in range(1, segments.max() + 1):
            where = np.flatnonzero(segments == segment)
            assert where.tolist() == list(range(where[0], where[-1] + 1))
            assert positions[where].tolist() == list(range(len(where)))
    # Lanes (2 devices x 2 micro-batches) balance to within one row's tokens.
    tokens = [int(np.count_nonzero(_lane(packed["segment_ids"], lane, 4, 2))) for lane in range(4)]
    assert max(tokens) - min(tokens) <= 64
    assert np.sum(packed["sample_mask"]) == np.sum(padded["sample_mask"])


def _lane(rows, lane, lanes, devices):
    chunks = lanes // devices
    device, chunk = divmod(lane, chunks)
    per_device = rows.reshape(devices, -1, *rows.shape[1:])[device]
    return per_device[chunk::chunks]


def test_buckets_are_few_and_waste_little():
    sizes = {bucket(n, 8) for n in range(1, 1025)}
    assert len(sizes) <= 8 * 10 + 8  # per octave, not per count
    for n in range(1, 1025):
        assert n <= bucket(n, 8) <= max(n, int(np.ceil(n * 2 ** (1 / 8))) + 1)


def test_a_sample_longer_than_a_row_is_refused():
    padded = make_batch(long_tail_groups(), max_seq_len=MAX_SEQ_LEN)
    with pytest.raises(ValueError, match="does not fit a row of trainer.row_tokens=8"):
        pack_batch(padded, row_tokens=8, lanes=1)


@pytest.mark.slow  # a minute: two compiles of a 4-layer model
def test_the_packing_benchmark_runs_sized_down():
    import json
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "benchmarks/packing.py", "--samples", "16", "--max-seq-len", "64",
                          "--repeats", "1"], cwd=repo, capture_output=True, text=True, timeout=300, check=True)
    result = json.loads(out.stdout)
    assert result["same_loss"] and result["packed"]["rows"] < result["padded"]["rows"]
    assert result["padded"]["tokens_per_s"] > 0 and result["packed"]["tokens_per_s"] > 0
    assert 0 <= result["padding_fraction"] < 1 and result["speedup"] > 0


@pytest.mark.slow
def test_micro_batches_by_tokens_compile_once_per_bucket_over_twenty_steps():
    """20 batches of varying lengths: the micro-batch count follows the tokens, and the update
    compiles once per distinct (bucketed) shape, not once per step."""
    algorithm = get_preset("grpo", kl_coef=0.0)
    update = trainer(algorithm, mesh=MeshConfig(data=2, fsdp=1), row_tokens=64, micro_batch_tokens=128,
                     row_buckets_per_octave=2)
    state = update.init_state()
    shapes, micro_batches = set(), set()
    for step in range(20):
        padded = make_batch(long_tail_groups(seed=step, groups=2 + step % 5), max_seq_len=MAX_SEQ_LEN)
        packed = update.pack(padded)
        shapes.add(tuple((name, x.shape) for name, x in sorted(packed.items())))
        micro_batches.add(update.micro_batches_of(packed))
        state, metrics = update.step(state, packed)
        assert np.isfinite(float(metrics["loss"]))
    assert len(micro_batches) > 1  # the micro-batch count moved with the tokens
    assert update._step._cache_size() == len(shapes) < 20


@pytest.mark.slow
def test_a_packed_step_lowers_for_a_batch_it_has_not_seen():
    """``rlax compile`` lowers a packed trainer's update from an assumed mean length: the arrays of
    a batch of that mean, its rows a bound from below (whole rows) and its sample slots even."""
    from rlax_core.training.packing import packed_batch_shapes

    update = trainer(get_preset("grpo", kl_coef=0.0), row_tokens=64, micro_batch_tokens=128)
    update.lower_step(update.abstract_state(), 16, mean_tokens=16).compile()
    padded = make_batch(long_tail_groups(groups=4), max_seq_len=MAX_SEQ_LEN)
    mean = real_tokens(padded) // 16
    expected = packed_batch_shapes(16, mean, max_seq_len=MAX_SEQ_LEN, row_tokens=64, rows_per_lane=2, lane_multiple=1)
    packed = update.pack(padded)
    assert {name: x.shape for name, x in packed.items()}.keys() == expected.keys()
    assert packed["loss_mask"].shape[1] == expected["loss_mask"][0][1]
    assert packed["tokens"].shape[0] >= expected["tokens"][0][0]  # whole rows are the bound from below
