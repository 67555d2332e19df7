"""Held-out evaluation of a policy on a task: pass@k with its standard error, reward, and fluency.

    report = evaluate_policy(model_config, params, tokenizer, examples, rewards=RewardConfig(...), engine=...,
                             samples=8, base_params=base_params)

pass@k is the unbiased estimator (``rlax_core.eval.metrics.pass_at_k``) averaged over prompts;
``pass@1_se`` is the standard error of that mean over prompts (samples of one prompt are not
independent draws of the task, prompts are). Fluency sits beside it so a rise in pass@k that came
from degenerate text shows: the mean per-token NLL of the completions under the *base* model
(``nll_base``: higher means less like the stories the model was trained on) and distinct-1/2.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.eval.metrics import pass_at_k
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import forward
from rlax_core.rewards.config import RewardConfig
from rlax_core.rewards.registry import Sample
from rlax_core.rewards.scorer import Rewarder
from rlax_core.tasks.prompts import prompt_ids
from rlax_core.tasks.story import distinct_n


def completion_nll(config: ModelConfig, params: Any, prompts: Sequence[Sequence[int]],
                   completions: Sequence[Sequence[int]], *, batch_size: int = 64) -> float:
    """Mean negative log-likelihood per completion token under ``params`` (float32)."""
    lengths = [len(p) + len(c) for p, c in zip(prompts, completions)]
    width = max(lengths)
    total, count = 0.0, 0

    @jax.jit
    def token_nll(tokens, mask, loss_mask):
        logits = forward(params, config, tokens, attention_mask=mask)[:, :-1]
        logp = jax.nn.log_softmax(logits, axis=-1)
        chosen = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        return -jnp.sum(chosen * loss_mask)

    for start in range(0, len(prompts), batch_size):
        rows = list(zip(prompts[start:start + batch_size], completions[start:start + batch_size]))
        tokens = np.zeros((batch_size, width), np.int32)
        mask = np.zeros((batch_size, width), np.int32)
        loss_mask = np.zeros((batch_size, width - 1), np.float32)
        for i, (prompt, completion) in enumerate(rows):
            n = len(prompt) + len(completion)
            tokens[i, :n] = list(prompt) + list(completion)
            mask[i, :n] = 1
            loss_mask[i, len(prompt) - 1:n - 1] = 1.0  # positions that predict completion tokens
        total += float(token_nll(tokens, mask, loss_mask))
        count += int(loss_mask.sum())
    return total / max(count, 1)


def evaluate_policy(model_config: ModelConfig, params: Any, tokenizer, examples: Sequence[Mapping[str, Any]], *,
                    rewards: RewardConfig, engine: EngineConfig, samples: int = 8, ks: Sequence[int] = (1, 8),
                    temperature: float = 1.0, stop_token_ids: Sequence[int] = (), seed: int = 0,
                    base_params: Any = None,
                    keep_texts: int = 8) -> dict[str, Any]:
    """Sample ``samples`` completions per example and score them; see the module docstring."""
    from rlax_core.inference.engine import Request
    from rlax_core.inference.replicas import ReplicatedEngine

    sampling = SamplingParams(temperature=temperature, max_new_tokens=engine.max_new_tokens, samples_per_prompt=samples,
                              stop_token_ids=tuple(stop_token_ids))
    requests = [Request(tuple(prompt_ids(example, tokenizer)), sampling, prompt_id=i, seed=seed)
                for i, example in enumerate(examples)]
    with ReplicatedEngine(engine, model_config, params) as replicas:
        completions = replicas.generate(requests)
    texts = [tokenizer.decode(c.completion_ids, skip_special_tokens=True) for c in completions]
    with Rewarder(rewards) as rewarder:
        scores = rewarder.score_many([Sample(examples[c.prompt_id], text, c.finish_reason, len(c.completion_ids))
                                      for c, text in zip(completions, texts)])

    correct = np.zeros((len(examples), samples), bool)
    for completion, (_, info) in zip(completions, scores):
        correct[completion.prompt_id, completion.sample_index] = bool(info.get("pass", False))
    lengths = [len(c.completion_ids) for c in completions]

    per_prompt = correct.mean(axis=1)
    report: dict[str, Any] = {
        "prompts": len(examples),
        "samples_per_prompt": samples,
        "pass@1_se": float(per_prompt.std(ddof=1) / math.sqrt(len(examples))) if len(examples) > 1 else None,
        "reward_mean": float(np.mean([reward for reward, _ in scores])),
        "response_length_mean": float(np.mean(lengths)),
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
    }
    for k in ks:
        if k <= samples:
            report[f"pass@{k}"] = float(np.mean([pass_at_k(samples, int(c), k) for c in correct.sum(axis=1)]))
    if base_params is not None:
        by_order = sorted(completions, key=lambda c: (c.prompt_id, c.sample_index))
        report["nll_base"] = completion_nll(model_config, base_params, [c.prompt_ids for c in by_order],
                                            [c.completion_ids for c in by_order])
    # The first sample of the first ``keep_texts`` prompts, so a reader sees different prompts.
    report["examples"] = [{"prompt": examples[c.prompt_id]["prompt"], "completion": texts[i]}
                          for i, c in enumerate(completions) if c.sample_index == 0 and c.prompt_id < keep_texts]
    return report
