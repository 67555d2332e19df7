"""Router replay end to end on stories260K upcycled into 4 experts (top 2): the engine records the experts
each position ran, the rollout rows and the store keep them, batching and packing carry them beside the
tokens, and the trainer replays them (``algorithm.router_replay``) and reports how far its own routing is."""

import dataclasses

import jax
import numpy as np
import pytest

from rlax_core.config import from_dict
from rlax_core.data.records import rollout_row, routed_experts_bytes, scored_row
from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.models import from_pretrained
from rlax_core.models.config import toy_config, toy_moe_config
from rlax_core.models.transformer import forward_with_routing, init_params
from rlax_core.models.upcycle import upcycle
from rlax_core.parallel import MeshConfig, make_mesh
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.training.batching import RoutedExperts, make_batch
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.packing import pack_batch
from rlax_core.training.job import run_training
from rlax_core.training.step import Trainer
from rlax_core.utils.metrics import read_metrics
from training_helpers import near_tied_routers, randomized

MAX_SEQ_LEN = 24
PROMPTS = [[1, 40, 47, 26, 78, 30], [1, 61, 90], [1, 43]]  # ids every model here has (the toys': 256)


@pytest.fixture(scope="module")
def near_tied():
    """A tiny Qwen3-MoE (4 experts, top 2; layer 0 dense) with near-tied routers (``near_tied_routers``):
    the engine's weights W and the trainer's W + delta; its completions sampled with W."""
    config = toy_moe_config()
    engine, trainer = near_tied_routers(config)
    return config, engine, trainer, generate(config, engine)


def generate(config, params, num_slots=4):
    # Pages of 32 tokens: one decode window width, one compiled decode program.
    engine = Engine(EngineConfig(num_slots=num_slots, max_prompt_len=8, max_new_tokens=12, page_size=32,
                                 num_pages=8, prefill_buckets=(8,), decode_steps_per_call=4), config, params)
    sampling = SamplingParams(temperature=1.0, samples_per_prompt=2, max_new_tokens=12)
    return engine.generate([Request(prompt, sampling, f"p{i}", seed=i) for i, prompt in enumerate(PROMPTS)])


def store_groups(tmp_path, completions):
    """The completions as scored rollout groups (one per prompt) through the rollout store."""
    store = RolloutStore(tmp_path, run="r")
    for index in range(len(PROMPTS)):
        key = GroupKey(0, index)
        rows = [scored_row(rollout_row(c, example_id=f"e{index}", group_id=store.group_id(key)), float(j % 2), {})
                for j, c in enumerate(c for c in completions if c.prompt_id == f"p{index}")]
        store.write_group(key, rows)
    return [store.read_group(key) for key in store.list_groups()]


def make_trainer(config, replay: bool, **overrides):
    trainer_config = TrainerConfig(max_seq_len=MAX_SEQ_LEN, mesh=MeshConfig(),
                                   optimizer=OptimizerConfig(learning_rate=1e-3, eps=1e-4), **overrides)
    return Trainer(config, AlgorithmConfig(router_replay=replay), trainer_config,
                   make_mesh(trainer_config.mesh, jax.devices()[:1]))


# ----------------------------------------------------------------------------- the engine's record


def test_the_engine_records_the_experts_of_every_position_it_ran(near_tied):
    """Away from ties (the engine's weights with their random routers) the record is the whole-sequence
    forward's own top k, in its order, at every position but the last (never fed; zeros), for the
    owners of a prefill and the siblings sharing it alike; a dense model records nothing."""
    config, _, _, _ = near_tied
    params = randomized(config)
    completions = generate(config, params)
    assert len(completions) == 6
    lengths = [len(c.prompt_ids) + len(c.completion_ids) for c in completions]
    ids = np.zeros((len(completions), max(lengths)), np.int32)  # one right-padded batch: one compilation
    for row, completion in enumerate(completions):
        ids[row, :lengths[row]] = [*completion.prompt_ids, *completion.completion_ids]
    forward = jax.jit(forward_with_routing, static_argnums=1)  # one program, not op by op
    _, routing = forward(params, config, ids, attention_mask=np.arange(ids.shape[1]) < np.c_[lengths])
    own = np.moveaxis(np.asarray(routing.expert_ids), 0, 2)  # [B, T, moe_layers, k]
    for row, (completion, length) in enumerate(zip(completions, lengths)):
        routed = completion.routed_experts
        assert routed.dtype == np.uint8 and routed.shape == (length, len(config.moe_layers), 2)
        np.testing.assert_array_equal(routed[:-1], own[row, :length - 1])
        assert not routed[-1].any()
    dense = toy_config()
    plain = generate(dense, init_params(dense, jax.random.key(0)), num_slots=2)
    assert all(c.routed_experts is None for c in plain)
    assert rollout_row(plain[0], example_id="e", group_id="g")["routed_experts"] is None


# ----------------------------------------------------------------------------- replay against the engine


@pytest.mark.parametrize("row_tokens", [0, pytest.param(32, marks=pytest.mark.slow)])  # padded rows; packed ones
def test_replay_gives_the_engines_log_probs_where_the_trainers_own_routing_does_not(near_tied, tmp_path, row_tokens):
    """The engine samples with W; the trainer holds W + delta (routers moved by 2e-7). Its own top 2
    flips at near-ties and its log-probs leave the engine's; replaying the recorded experts gives the
    engine's log-probs within 1e-5, in padded rows and packed ones alike. With replay on, the update's
    own forward replays (its importance ratio against the engine is 1); with it off, it does not, and
    its batches carry no ids and its step runs no diagnostics (no forward more than a dense model's)."""
    config, _, trainer_params, completions = near_tied
    groups = store_groups(tmp_path, completions)
    for replay in (True, False):
        trainer = make_trainer(config, replay, row_tokens=row_tokens)
        padded = make_batch(groups, max_seq_len=MAX_SEQ_LEN, row_multiple=trainer.row_multiple,
                            routed=trainer.replay.records)
        assert ("routed_experts" in padded) == replay
        batch = trainer.pack(padded)
        assert ("segment_ids" in batch) == bool(row_tokens)
        state = trainer.init_state(trainer_params)
        prepared = jax.device_get(trainer.prepare_batch(state, batch))
        mask, behavior = batch["loss_mask"] > 0, batch["behavior_logprobs"]
        assert mask.sum() == 72
        _, metrics = trainer.step(state, batch)
        # mismatch_kl: the engine's log-probs against the update's own (k3 estimate).
        assert (float(metrics["mismatch_kl"]) < 1e-9) == replay
        if not replay:
            assert not {"routing_agreement", "logprobs_replay", "logprobs_no_replay"} & set(prepared)
            assert not {"routing_agreement", "logprob_mismatch_replay", "logprob_mismatch_no_replay"} & set(metrics)
            continue
        np.testing.assert_allclose(prepared["logprobs_replay"][mask], behavior[mask], atol=1e-5, rtol=0)
        assert np.abs(prepared["logprobs_no_replay"][mask] - behavior[mask]).max() > 1e-1
        assert 0.3 < prepared["routing_agreement"][mask].mean() < 0.95  # the routers flipped
        assert float(metrics["logprob_mismatch_replay"]) < 1e-5
        assert float(metrics["logprob_mismatch_no_replay"]) > 1e-2
        np.testing.assert_allclose(float(metrics["routing_agreement"]), prepared["routing_agreement"][mask].mean(),
                                   rtol=1e-5)


def test_the_router_learns_through_the_replayed_experts(near_tied, tmp_path):
    config, _, trainer_params, completions = near_tied
    trainer = make_trainer(config, replay=True)
    batch = make_batch(store_groups(tmp_path, completions), max_seq_len=MAX_SEQ_LEN, routed=trainer.replay.records)
    state, _ = trainer.step(trainer.init_state(trainer_params), batch)
    layer = f"layers_{config.moe_layers[0]}"
    moved = np.asarray(state.params[layer]["moe"]["router"]) - np.asarray(trainer_params[layer]["moe"]["router"])
    assert np.abs(moved).max() > 1e-5


@pytest.mark.slow  # compiles an engine and a trainer step for a 5-layer mixture: 80 s on the loaded 2-core box
def test_upcycled_stories260k_reports_routing_agreement_in_the_runs_metrics(stories260k_dir, tmp_path):
    """The tiny MoE of the quickstart (stories260K upcycled: 4 experts, top 2, 1% noise): the engine's
    records through the rollout store into a replaying training job, whose metrics file has the
    agreement and both mismatches (train/...)."""
    stories = from_pretrained(stories260k_dir)
    config, params = upcycle(stories.config, stories.params, num_experts=4, experts_per_token=2, noise=0.01,
                             rng=jax.random.key(0))
    store_groups(tmp_path / "rollouts", generate(config, params))
    trainer_config = from_dict(TrainerConfig, {"groups_per_step": len(PROMPTS), "max_seq_len": MAX_SEQ_LEN,
                                               "total_steps": 1, "async_checkpointing": False, "poll_s": 0.05,
                                               "wait_timeout_s": 60, "scan_layers": False})
    result = run_training(model_config=config, initial_params=params, algorithm=AlgorithmConfig(router_replay=True),
                          config=trainer_config, store=RolloutStore(tmp_path / "rollouts", "r"), weights=None,
                          checkpoint_dir=str(tmp_path / "checkpoints"), metrics_dir=str(tmp_path / "metrics"))
    assert result.step == 1
    [row] = read_metrics(tmp_path / "metrics")
    # The same weights in both: the programs' roundings alone move a few near-tied choices.
    assert 0.9 < row["train/routing_agreement"] <= 1.0
    assert row["train/logprob_mismatch_replay"] < 1e-5
    assert row["train/logprob_mismatch_no_replay"] >= row["train/logprob_mismatch_replay"]


# ----------------------------------------------------------------------------- the record's round trip


@pytest.mark.parametrize("num_experts", [4, 300])
def test_routed_experts_round_trip_through_the_store_batching_and_packing(tmp_path, num_experts):
    """Random ids (uint8; uint16 past 256 experts) written as rollout rows, read back from parquet,
    batched beside their tokens and packed into rows: each token keeps its experts, padding holds 0."""
    layout = RoutedExperts(moe_layers=3, experts_per_token=2, dtype="uint8" if num_experts <= 256 else "uint16")
    rng = np.random.default_rng(0)
    store = RolloutStore(tmp_path, run="r")
    originals = []
    for index, (prompt_len, completion_len) in enumerate([(3, 5), (6, 2), (2, 9)]):
        key = GroupKey(0, index)
        rows = []
        for sample in range(2):
            tokens = prompt_len + completion_len + sample
            ids = rng.integers(0, num_experts, (tokens, 3, 2)).astype(layout.dtype)
            originals.append(ids)
            rows.append(dict(example_id="e", group_id=store.group_id(key), sample_idx=sample, policy_version=0, seed=0,
                             prompt_ids=list(range(1, prompt_len + 1)), completion_ids=[7] * (completion_len + sample),
                             behavior_logprobs=[-1.0] * (completion_len + sample), finish_reason="stop", reward=1.0,
                             reward_info="{}", routed_experts=routed_experts_bytes(ids)))
        store.write_group(key, rows)
    groups = [store.read_group(key) for key in store.list_groups()]
    batch = make_batch(groups, max_seq_len=16, row_multiple=4, routed=layout)
    assert batch["routed_experts"].shape == (8, 16, 3, 2) and batch["routed_experts"].dtype == np.dtype(layout.dtype)
    for row, ids in enumerate(originals):
        np.testing.assert_array_equal(batch["routed_experts"][row, :len(ids)], ids)
        assert not batch["routed_experts"][row, len(ids):].any()
    assert not batch["routed_experts"][len(originals):].any()

    packed = pack_batch(batch, row_tokens=16, lanes=2)
    for slot in np.flatnonzero(packed["sample_mask"] > 0):  # slot i * 2 + lane, row sample_row * 2 + lane
        row = packed["sample_row"][slot] * 2 + slot % 2
        offset = packed["sample_offset"][slot]
        length = int(packed["loss_mask"][slot].sum()) + np.flatnonzero(packed["loss_mask"][slot])[0] + 1
        assert any(len(ids) == length and np.array_equal(packed["routed_experts"][row, offset:offset + length], ids)
                   for ids in originals)
    assert not packed["routed_experts"][packed["segment_ids"] == 0].any()


def test_records_without_routed_experts_are_refused_under_replay_and_skipped_without(tmp_path):
    store = RolloutStore(tmp_path, run="r")
    key = GroupKey(0, 0)
    row = dict(example_id="e", group_id=store.group_id(key), sample_idx=0, policy_version=0, seed=0, prompt_ids=[1, 2],
               completion_ids=[3], behavior_logprobs=[-1.0], finish_reason="stop", reward=1.0, reward_info="{}")
    short = {**row, "sample_idx": 1, "routed_experts": routed_experts_bytes(np.zeros((2, 3, 2), np.uint8))}
    store.write_group(key, [row, short])
    group = [store.read_group(key)]
    layout = RoutedExperts(moe_layers=3, experts_per_token=2, dtype="uint8")
    with pytest.raises(ValueError, match=r"rollout r/0/0#0 has no routed_experts: algorithm.router_replay"):
        make_batch(group, max_seq_len=8, routed=dataclasses.replace(layout, required=True))
    assert "routed_experts" not in make_batch(group, max_seq_len=8, routed=layout)  # no replay: no diagnostics
    with pytest.raises(ValueError, match=r"rollout r/0/0#1: routed_experts of 12 bytes for 3 tokens x 3 sparse"):
        make_batch([group[0].slice(1)], max_seq_len=8, routed=layout)


def test_router_replay_on_a_dense_model_is_refused():
    with pytest.raises(ValueError, match="algorithm.router_replay: the model is dense"):
        make_trainer(toy_config(), replay=True)
    trainer = make_trainer(toy_config(), replay=False)
    assert trainer.replay.records is None  # a dense model's batches carry nothing
    assert make_trainer(toy_moe_config(), replay=False).replay.records is None  # nor a mixture's without replay
