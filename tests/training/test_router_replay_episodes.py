"""Router replay beyond single turns: multi-turn episodes record every position's experts (observations
too) and the trainer replays them; a recomputed position keeps the recomputation's experts.

The toy MoE (``toy_moe_config``: 4 experts, top 2, layer 0 dense) with stories260K's vocabulary, so
that its tokenizer can run the episodes; its routers are near-tied (``near_tied_routers``): the
trainer's weights W + delta flip its own top 2 against the engine's W, and only replay gives the
engine's log-probs."""

import dataclasses

import jax
import numpy as np
import pytest

from rlax_core.data.records import rollout_row, routed_experts_array, routed_experts_bytes, scored_row
from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.envs import EnvConfig, EpisodeStart, RecordedEnvironment, run_episodes
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.engine import Engine, Request
from rlax_core.models.config import toy_moe_config
from rlax_core.models.tokenizer import load_tokenizer
from rlax_core.models.transformer import forward_with_routing
from rlax_core.parallel import MeshConfig, make_mesh
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.training.batching import make_batch
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.step import Trainer
from training_helpers import near_tied_routers, randomized

MAX_SEQ_LEN = 40
# One 64-token page per sequence: one decode window width, one prefill bucket, few compiled programs.
ENGINE = EngineConfig(num_slots=4, max_prompt_len=32, max_new_tokens=8, page_size=64, num_pages=8,
                      prefill_buckets=(32,), decode_steps_per_call=4)
TURNS = [{"observation": " Then it rained.", "reward": 0.0, "info": {}},
         {"observation": " Mom said:", "reward": 0.0, "info": {}},
         {"observation": "", "reward": 1.0, "info": {}}]
PROMPTS = ["Once upon a time", "The dog"]


@pytest.fixture(scope="module")
def moe(stories260k_dir):
    tokenizer = load_tokenizer(stories260k_dir)
    config = toy_moe_config(vocab_size=tokenizer.vocab_size)
    engine_params, trainer_params = near_tied_routers(config)
    return config, tokenizer, engine_params, trainer_params


def run(config, tokenizer, params):
    """Two prompts, two episodes each, of three turns with two observations between them."""
    engine = Engine(ENGINE, config, params)
    env = EnvConfig(name="word_chain", tools=(), max_turns=3, max_turn_tokens=6, max_tokens=MAX_SEQ_LEN)
    starts = [EpisodeStart({"prompt": text}, prompt_id=f"p{i}", seed=i, samples=2) for i, text in enumerate(PROMPTS)]
    recorded = lambda row, _: RecordedEnvironment(row["prompt"], TURNS)  # noqa: E731
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, ignore_eos=True)
    return run_episodes(engine, tokenizer, env, starts, sampling, environment=recorded)


def make_trainer(config):
    trainer_config = TrainerConfig(max_seq_len=MAX_SEQ_LEN, mesh=MeshConfig(),
                                   optimizer=OptimizerConfig(learning_rate=1e-3, eps=1e-4))
    return Trainer(config, AlgorithmConfig(router_replay=True), trainer_config,
                   make_mesh(trainer_config.mesh, jax.devices()[:1]))


def store_groups(path, rows_per_group):
    store = RolloutStore(path, run="r")
    for index, rows in enumerate(rows_per_group):
        key = GroupKey(0, index)
        store.write_group(key, [{**row, "group_id": store.group_id(key)} for row in rows])
    return [store.read_group(key) for key in store.list_groups()]


def episode_rows(episodes):
    """The episodes as the episode sampler writes them (``rollout.samplers``), one group per prompt."""
    groups = {}
    for episode in episodes:
        groups.setdefault(episode.prompt_id, []).append(
            {"example_id": f"e-{episode.prompt_id}", "group_id": "", "sample_idx": episode.sample_index,
             "reward_info": "{}", **episode.rollout_fields()})
    return list(groups.values())


@pytest.mark.slow  # its own engine's compile; the replay test below fails too if an observation's ids are wrong
def test_an_episodes_record_is_every_positions_own_top_k_observations_included(moe):
    """Away from ties, an episode's record (its rollout row's ``routed_experts``) is the whole
    transcript's forward's own top 2 at every position but the last (never fed: zeros), the
    observations' positions (computed between turns) included."""
    config, tokenizer, _, _ = moe
    params = randomized(config)
    for episode in run(config, tokenizer, params):
        ids = episode.prompt_ids + episode.completion_ids
        assert len(episode.turns) == 3 and 0 in episode.policy_mask  # observations in the transcript
        row = episode.rollout_fields()
        routed = routed_experts_array(row["routed_experts"], len(config.moe_layers), 2, "uint8")
        assert routed.shape == (len(ids), len(config.moe_layers), 2)
        _, routing = forward_with_routing(params, config, np.asarray([ids], np.int32))
        own = np.moveaxis(np.asarray(routing.expert_ids), 0, 2)[0]  # [T, moe_layers, k]
        np.testing.assert_array_equal(routed[:-1], own[:-1])
        assert not routed[-1].any()


def test_replay_gives_an_episodes_engine_log_probs(moe, tmp_path):
    """Episodes sampled with W, trained from W + delta: with replay the trainer's log-probs of every
    policy token of every turn are the engine's within 1e-5; its own routing leaves them by > 0.1."""
    config, tokenizer, engine_params, trainer_params = moe
    episodes = run(config, tokenizer, engine_params)
    trainer = make_trainer(config)
    batch = make_batch(store_groups(tmp_path, episode_rows(episodes)), max_seq_len=MAX_SEQ_LEN,
                       row_multiple=trainer.row_multiple, routed=trainer.replay.records)
    prepared = jax.device_get(trainer.prepare_batch(trainer.init_state(trainer_params), batch))
    mask, behavior = batch["loss_mask"] > 0, batch["behavior_logprobs"]
    assert mask.sum() == sum(sum(e.policy_mask) for e in episodes) == 4 * 3 * 6  # the turns' tokens alone
    np.testing.assert_allclose(prepared["logprobs_replay"][mask], behavior[mask], atol=1e-5, rtol=0)
    assert np.abs(prepared["logprobs_no_replay"][mask] - behavior[mask]).max() > 1e-1


def test_a_recomputed_position_keeps_the_recomputing_versions_experts(moe, tmp_path):
    """The documented rule (docs/training.md, router replay): a swap to W + delta in mid-generation
    (``on_new_version: recompute``) recomputes the cached positions with the new weights, and the
    record keeps the recomputation's experts. The trainer on W + delta then replays the very network
    that sampled every token after the swap: their log-probs are the engine's within 1e-5. Keeping
    the first computation's experts instead (what an engine that never swapped recorded for those
    positions) leaves them by more than 1e-3."""
    config, tokenizer, engine_params, trainer_params = moe
    prompts = [tokenizer.encode(text, add_bos=True) for text in PROMPTS]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, ignore_eos=True)
    requests = [Request(prompt, sampling, f"p{i}", seed=i) for i, prompt in enumerate(prompts)]
    chunk = ENGINE.decode_steps_per_call

    engine = Engine(dataclasses.replace(ENGINE, on_new_version="recompute"), config, engine_params, version=0)
    for request in requests:
        engine.add_request(request)
    finished = engine.step()  # a prefill and one decode call of `chunk` tokens under version 0
    engine.update_weights(trainer_params, version=1)
    while engine.has_unfinished():
        finished += engine.step()
    swapped = [c for _, c in sorted(finished, key=lambda pair: pair[0])]
    assert engine.stats["recomputed"] == len(prompts)
    assert all(c.token_versions == (0,) * chunk + (1,) * (8 - chunk) for c in swapped)
    unswapped = Engine(ENGINE, config, engine_params).generate(requests)  # the first computation's record
    assert [c.completion_ids[:chunk] for c in unswapped] == [c.completion_ids[:chunk] for c in swapped]

    def first_ids(completion, original):  # the recomputed positions (all but the decode step's) as first run
        routed = completion.routed_experts.copy()
        recomputed = len(completion.prompt_ids) + chunk - 1
        routed[:recomputed] = original.routed_experts[:recomputed]
        return routed

    trainer = make_trainer(config)
    state = trainer.init_state(trainer_params)
    gaps = {}
    for rule, records in (("recomputation", [c.routed_experts for c in swapped]),
                          ("first", [first_ids(c, o) for c, o in zip(swapped, unswapped)])):
        rows = [[scored_row({**rollout_row(c, example_id=f"e{i}", group_id=""),
                             "routed_experts": routed_experts_bytes(routed)}, 0.0, {})]
                for i, (c, routed) in enumerate(zip(swapped, records))]
        batch = make_batch(store_groups(tmp_path / rule, rows), max_seq_len=MAX_SEQ_LEN,
                           row_multiple=trainer.row_multiple, routed=trainer.replay.records)
        prepared = jax.device_get(trainer.prepare_batch(state, batch))
        gap = []
        for row in range(len(swapped)):  # the tokens sampled after the swap: the masked ones after `chunk`
            after = np.flatnonzero(batch["loss_mask"][row] > 0)[chunk:]
            gap.append(np.abs(prepared["logprobs_replay"][row, after] - batch["behavior_logprobs"][row, after]).max())
        gaps[rule] = max(gap)
    assert gaps["recomputation"] < 1e-5
    assert gaps["first"] > 1e-3
