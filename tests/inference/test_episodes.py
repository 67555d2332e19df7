"""Multi-turn episodes in the engine: a turn continues from the cached history, exactly."""

import jax
import numpy as np
import pytest

from rlax_core.inference.config import SamplingParams
from rlax_core.inference.engine import Engine, Request
from tests.support.tolerances import assert_reordered_close, decoder_logprob_bound

TURN = SamplingParams(temperature=1.0, max_new_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(stories, small_engine_config):
    model, tokenizer = stories
    return Engine(small_engine_config, model.config, model.params, detokenize=tokenizer.decode)


def _full_forward_logprobs(model, ids, padded_to=288):
    mask = np.zeros((1, padded_to), np.int32)
    mask[0, :len(ids)] = 1
    padded = np.zeros((1, padded_to), np.int32)
    padded[0, :len(ids)] = ids
    logits = np.asarray(model(padded, mask)[0, :len(ids)])
    return np.asarray(jax.nn.log_softmax(logits[:-1], axis=-1))[np.arange(len(ids) - 1), ids[1:]]


def _run_episodes(engine, prompts, observations, seed=5):
    """Every episode: a first turn, then one turn after each observation; returns transcripts."""
    finished = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(Request(prompt, TURN, prompt_id=i, seed=seed, episode_tokens=160))
    transcripts = {i: {"ids": list(p), "policy": [0] * len(p), "logprobs": [0.0] * len(p), "versions": []}
                   for i, p in enumerate(prompts)}
    turns = {i: 0 for i in range(len(prompts))}
    while engine.has_unfinished():
        for _, completion in engine.step():
            record = transcripts[completion.prompt_id]
            assert list(completion.prompt_ids) == record["ids"]
            record["ids"] += completion.completion_ids
            record["policy"] += [1] * len(completion.completion_ids)
            record["logprobs"] += completion.logprobs
            record["versions"].append(completion.weight_version)
            turn = turns[completion.prompt_id]
            if turn < len(observations):
                obs = observations[turn]
                record["ids"] += obs
                record["policy"] += [0] * len(obs)
                record["logprobs"] += [0.0] * len(obs)
                turns[completion.prompt_id] += 1
                engine.continue_episode(completion.episode, obs, TURN)
            else:
                finished[completion.prompt_id] = completion.episode
                engine.end_episode(completion.episode)
    assert sorted(finished) == list(range(len(prompts)))
    return transcripts


def test_turn_logprobs_equal_a_full_forward_of_the_transcript(engine, stories):
    model, tokenizer = stories
    prompts = [tokenizer.encode(t, add_bos=True) for t in ["Once upon a time", "The dog", "A", "Lily saw", "Tom"]]
    observations = [tokenizer.encode(" Then the sun came out.", add_bos=False), tokenizer.encode(" Mom said:", add_bos=False)]
    free_before = engine.pages.num_free
    calls_before = engine.stats["prefill_calls"]
    transcripts = _run_episodes(engine, prompts, observations)
    assert engine.pages.num_free == free_before  # every page came back
    assert engine.stats["prefill_calls"] - calls_before <= 2  # first turns only: later turns reuse the prefix
    for record in transcripts.values():
        expected = _full_forward_logprobs(model, record["ids"])
        policy = np.asarray(record["policy"][1:], bool)
        # Turns decoded step by step against one forward of the transcript: the same sums reordered.
        bound = decoder_logprob_bound(model.config, context=len(record["ids"]))
        assert_reordered_close(np.asarray(record["logprobs"][1:])[policy], expected[policy], bound)
        assert len(record["versions"]) == len(observations) + 1


def test_episodes_replay_token_for_token(engine, stories):
    _, tokenizer = stories
    prompts = [tokenizer.encode(t, add_bos=True) for t in ["Once upon a time", "The dog"]]
    observations = [tokenizer.encode(" Then it rained.", add_bos=False)]
    first = _run_episodes(engine, prompts, observations, seed=11)
    again = _run_episodes(engine, prompts, observations, seed=11)
    other = _run_episodes(engine, prompts, observations, seed=12)
    assert [r["ids"] for r in first.values()] == [r["ids"] for r in again.values()]
    assert [r["ids"] for r in first.values()] != [r["ids"] for r in other.values()]


def test_a_turn_after_a_weight_swap_is_computed_by_the_new_weights(stories, small_engine_config):
    from rlax_core.models.transformer import forward

    model, tokenizer = stories
    engine = Engine(small_engine_config, model.config, model.params, version=0)
    prompt = tokenizer.encode("Once upon a time", add_bos=True)
    [first] = engine.generate([Request(prompt, TURN, prompt_id="a", seed=3, episode_tokens=96)])
    new_params = jax.tree.map(lambda x: x * 1.05, model.params)
    engine.update_weights(new_params, version=1)
    observation = tokenizer.encode(" Then it rained.", add_bos=False)
    engine.continue_episode(first.episode, observation, TURN)
    [(_, second)] = [pair for pair in _drain(engine)]
    assert (first.weight_version, second.weight_version) == (0, 1)
    ids = list(second.prompt_ids) + list(second.completion_ids)
    mask = np.ones((1, len(ids)), np.int32)
    logits = np.asarray(forward(new_params, model.config, np.asarray([ids], np.int32), attention_mask=mask)[0])
    expected = np.asarray(jax.nn.log_softmax(logits[:-1], axis=-1))[np.arange(len(ids) - 1), ids[1:]]
    assert_reordered_close(second.logprobs, expected[len(second.prompt_ids) - 1:],
                           decoder_logprob_bound(model.config, context=len(ids)))
    engine.end_episode(second.episode)


def _drain(engine):
    out = []
    while engine.has_unfinished():
        out.extend(engine.step())
    return out


def test_a_parked_episode_holds_pages_not_a_slot(stories, small_engine_config):
    model, tokenizer = stories
    engine = Engine(small_engine_config, model.config, model.params)
    prompt = tokenizer.encode("The dog", add_bos=True)
    slots = small_engine_config.num_slots
    parked = engine.generate([Request(prompt, TURN, prompt_id=f"ep{i}", episode_tokens=64) for i in range(slots)])
    assert engine.parked_episodes() == slots and engine.active_slots() == 0
    # While every episode waits for its tool, plain requests use all the slots.
    done = engine.generate([Request(prompt, TURN, prompt_id=f"other{i}") for i in range(slots)])
    assert [c.finish_reason for c in done] == ["length"] * slots
    free = engine.pages.num_free
    for completion in parked:
        engine.end_episode(completion.episode)  # a parked episode's pages come back at its end
    assert engine.pages.num_free == small_engine_config.num_pages - 1 > free  # the whole pool is free again
    with pytest.raises(KeyError, match="no finished turn waiting"):
        engine.continue_episode(parked[1].episode, [5], TURN)  # ended: nothing waits


def test_a_continuation_that_overruns_the_episode_budget_fails_with_the_reason(stories, small_engine_config):
    model, tokenizer = stories
    engine = Engine(small_engine_config, model.config, model.params)
    [first] = engine.generate([Request([1, 5, 6], TURN, prompt_id="b", episode_tokens=24)])
    with pytest.raises(ValueError, match="exceed its episode_tokens=24"):
        engine.continue_episode(first.episode, [7] * 5, TURN)
    with pytest.raises(ValueError, match="must hold the prompt and its first turn"):
        engine.add_request(Request([1, 5, 6], TURN, episode_tokens=8))
    engine.end_episode(first.episode)


@pytest.mark.slow
def test_an_engine_warmed_up_for_episodes_compiles_nothing_for_a_second_turn(stories, small_engine_config):
    from rlax_core.inference.sampling import SamplingMode
    from tests.support.compiles import COMPILES

    model, tokenizer = stories
    engine = Engine(small_engine_config, model.config, model.params, device=jax.devices()[0])
    engine.warm_up(modes=(SamplingMode.TEMPERATURE,), episodes=True)
    before = COMPILES.count
    prompts = [tokenizer.encode(text, add_bos=True) for text in ("Once upon a time", "The dog ran")]
    transcripts = _run_episodes(engine, prompts, [tokenizer.encode(" The end.")] * 2)
    assert all(len(record["versions"]) == 3 for record in transcripts.values())  # three turns each
    assert COMPILES.count == before, f"{COMPILES.count - before} compilations after warm-up"
