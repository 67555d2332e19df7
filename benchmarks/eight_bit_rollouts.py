"""Rollouts in eight bits against bfloat16, on stories260K and the quickstart's held-out prompts.

Greedy completions (64 new tokens, the quickstart's budget) from an engine with ``weight_dtype`` and
``cache_dtype`` int8 (``--dtype fp8``: fp8) are scored by the bfloat16 policy as the trainer scores
them (``training.logprobs.token_logprobs``, the whole prompt + completion in one forward):

  agreement       the fraction of the eight-bit engine's tokens that are the bfloat16 policy's own
                  greedy choice after the same prefix (teacher-forced: a token chosen after an
                  earlier disagreement still counts when bfloat16 would choose it there too)
  free_agreement  the fraction of positions where the two engines' free-running greedy
                  completions hold the same token (one early disagreement costs the rest of a row)
  mismatch_kl     the RL loss's ``mismatch_kl`` (k3 of the engine's log-probs against the bfloat16
                  policy's, on the engine's tokens): what ``rl.objective.mismatch_weights`` logs
  baseline_kl     the same for a bfloat16 engine: the mismatch the engine has at full width

Prints one JSON object. ``python benchmarks/eight_bit_rollouts.py [--prompts 64] [--dtype int8]``
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlax_core.inference import Engine, EngineConfig, Request, SamplingParams  # noqa: E402
from rlax_core.models import from_pretrained  # noqa: E402
from rlax_core.models.tokenizer import load_tokenizer  # noqa: E402
from rlax_core.rl.kl import kl_estimate  # noqa: E402
from rlax_core.training.logprobs import token_logprobs  # noqa: E402

ASSETS = Path(__file__).resolve().parents[1] / "pipelines" / "assets"
NEW_TOKENS = 64
ENGINE = EngineConfig(num_slots=64, page_size=16, num_pages=640, max_prompt_len=64, max_new_tokens=NEW_TOKENS,
                      prefill_buckets=(32, 64), decode_steps_per_call=16, cache_dtype="bfloat16")


def heldout_prompts(count: int) -> list[str]:
    rows = [json.loads(line) for line in (ASSETS / "story_task" / "heldout.jsonl").read_text().splitlines() if line]
    return [row["prompt"] for row in rows[:count]]


def compare(prompts: int = 64, dtype: str = "int8") -> dict:
    model = from_pretrained(ASSETS / "stories260K")
    tokenizer = load_tokenizer(ASSETS / "stories260K")
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), model.params)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    requests = [Request(tokenizer.encode(text, add_bos=True), greedy, prompt_id=str(i))
                for i, text in enumerate(heldout_prompts(prompts))]
    runs = {}
    for name, config in (("bfloat16", ENGINE),
                         (dtype, dataclasses.replace(ENGINE, weight_dtype=dtype, cache_dtype=dtype))):
        completions = Engine(config, model.config, params).generate(requests)
        runs[name] = [(r.prompt_ids, c.completion_ids, np.asarray(c.logprobs)) for r, c in zip(requests, completions)]

    def scored(run):  # the bfloat16 policy's log-probs and greedy choices on a run's tokens
        length = max(len(p) + len(c) for p, c, _ in run)
        tokens = np.zeros((len(run), length), np.int32)
        mask = np.zeros_like(tokens)
        for row, (prompt, completion, _) in enumerate(run):
            tokens[row, :len(prompt) + len(completion)] = [*prompt, *completion]
            mask[row, :len(prompt) + len(completion)] = 1
        logits_fn = jax.jit(lambda p, t, m: token_logprobs(p, model.config, t, m)[0])
        logprobs = np.asarray(logits_fn(params, tokens, mask))
        from rlax_core.models.transformer import forward
        choices = np.asarray(jax.jit(lambda p, t, m: jnp.argmax(forward(p, model.config, t, attention_mask=m), -1))(
            params, tokens, mask))
        agree, total, kls = 0, 0, []
        for row, (prompt, completion, engine_logprobs) in enumerate(run):
            at = np.arange(len(prompt) - 1, len(prompt) + len(completion) - 1)  # position t predicts token t + 1
            agree += int((choices[row, at] == np.asarray(completion)).sum())
            total += len(completion)
            kls.append(np.asarray(kl_estimate(jnp.asarray(engine_logprobs), jnp.asarray(logprobs[row, at]), "k3")))
        return agree / total, float(np.mean(np.concatenate(kls)))

    agreement, mismatch_kl = scored(runs[dtype])
    baseline_agreement, baseline_kl = scored(runs["bfloat16"])
    same = sum(int(a == b) for (_, x, _), (_, y, _) in zip(runs[dtype], runs["bfloat16"]) for a, b in zip(x, y))
    return {"dtype": dtype, "prompts": len(requests), "new_tokens": NEW_TOKENS, "agreement": round(agreement, 4),
            "free_agreement": round(same / sum(len(c) for _, c, _ in runs["bfloat16"]), 4),
            "mismatch_kl": mismatch_kl, "baseline_agreement": round(baseline_agreement, 4), "baseline_kl": baseline_kl,
            "loadavg": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--dtype", choices=("int8", "fp8"), default="int8")
    args = parser.parse_args()
    print(json.dumps(compare(args.prompts, args.dtype)))


if __name__ == "__main__":
    main()
