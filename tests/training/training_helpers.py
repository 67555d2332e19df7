"""Small real pieces the trainer tests share: a sampler over the toy model and rollout groups from it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.data.rollout_store import GroupKey, RolloutStore
from rlax_core.models.transformer import forward


def sample(params, config, prompts: np.ndarray, num_new: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``num_new`` tokens after each prompt row (full recompute: tiny model, few tokens).

    Returns the completions [N, num_new] and the sampler's log-probs of them.
    """
    completions, logps = _sample(params, config, jnp.asarray(prompts, jnp.int32), num_new, rng)
    return np.asarray(completions), np.asarray(logps)


@functools.partial(jax.jit, static_argnums=(1, 3))
def _sample(params, config, prompts, num_new, rng):
    rows, prompt_len = prompts.shape
    buffer = jnp.concatenate([prompts, jnp.zeros((rows, num_new), jnp.int32)], axis=1)

    def body(i, carry):
        buffer, logps, rng = carry
        rng, key = jax.random.split(rng)
        logits = forward(params, config, buffer)[:, prompt_len + i - 1]
        token = jax.random.categorical(key, logits)
        logp = jax.nn.log_softmax(logits)[jnp.arange(rows), token]
        return buffer.at[:, prompt_len + i].set(token), logps.at[:, i].set(logp), rng

    buffer, logps, _ = jax.lax.fori_loop(0, num_new, body, (buffer, jnp.zeros((rows, num_new)), rng))
    return buffer[:, prompt_len:], logps


def rollout_rows(store: RolloutStore, key: GroupKey, prompt, completions, logps, rewards, version: int):
    return [dict(example_id=f"ex{key.prompt_index}", group_id=store.group_id(key), sample_idx=j,
                 policy_version=version, seed=j, prompt_ids=[int(t) for t in prompt],
                 completion_ids=[int(t) for t in completions[j]], behavior_logprobs=[float(x) for x in logps[j]],
                 finish_reason="length", reward=float(rewards[j]), reward_info="{}")
            for j in range(len(completions))]


def write_random_groups(store: RolloutStore, steps, *, groups_per_step: int, samples: int = 4,
                        prompt_len: int = 5, completion_len: int = 6, vocab: int = 256, seed: int = 0):
    """Groups with random tokens and rewards: enough to exercise the job's bookkeeping exactly."""
    for step in steps:
        for index in range(groups_per_step):
            key = GroupKey(step, index)
            rng = np.random.default_rng([seed, step, index])
            prompt = rng.integers(3, vocab, prompt_len)
            completions = rng.integers(3, vocab, (samples, completion_len))
            logps = -rng.random((samples, completion_len)) * 5
            rewards = rng.random(samples)
            store.write_group(key, rollout_rows(store, key, prompt, completions, logps, rewards, version=step))


def randomized(config, seed=0, scale=0.2):
    """``config``'s initial weights plus noise of ``scale`` (away from the initialisation's symmetries)."""
    from rlax_core.models.transformer import init_params

    params = init_params(config, jax.random.key(seed))
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed + 1), len(leaves))
    return jax.tree.unflatten(tree, [x + scale * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])


def near_tied_routers(config):
    """A mixture's weights whose routers' columns are equal up to 1e-7, so that the top k is a near-tie
    at every token: (the engine's weights W, the trainer's W + delta, its routers moved by 2e-7, a
    rounding's worth)."""
    engine = randomized(config)
    trainer = jax.tree.map(lambda x: x, engine)
    for index, layer in enumerate(f"layers_{i}" for i in config.moe_layers):
        router = engine[layer]["moe"]["router"]  # [hidden, experts]
        engine[layer]["moe"]["router"] = router[:, :1] + 1e-7 * jax.random.normal(jax.random.key(10 + index), router.shape)
        trainer[layer]["moe"]["router"] = (engine[layer]["moe"]["router"]
                                           + 2e-7 * jax.random.normal(jax.random.key(20 + index), router.shape))
    return engine, trainer
