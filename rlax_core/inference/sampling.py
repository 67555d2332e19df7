"""Token selection: greedy, temperature, top-k, top-p; keys derived per sample; behavior log-probs.

Costs on CPU drive the formulation (a 32k vocabulary, 64 rows): greedy is two plain reductions,
a draw is a two-level inverse CDF from one uniform per row, and top-k / top-p are thresholds
found by bisection instead of a sort of the vocabulary.

Reproducibility: the key of token ``t`` of sample ``i`` of prompt ``p`` under run seed ``s`` is
``fold_in(fold_in(fold_in(key(s), p), i), t)``. It depends on nothing else (not the slot, not the
other sequences in the batch, not when the request was admitted), so any single rollout can be
regenerated exactly from its (seed, prompt id, sample index).

Log-probs: every sampled token is returned with ``log_softmax(logits)[token]`` computed in float32
from the model's raw logits: no temperature, no top-k/top-p truncation. That is the policy
distribution pi(token | context) that the trainer recomputes, so behavior and trainer log-probs
agree up to numerics whatever sampling settings produced the token. (The distribution the token
was actually drawn from is the tempered, truncated one; importance corrections that need it must
account for the difference.)
"""

from __future__ import annotations

import enum
import math
import zlib
from typing import Callable

import jax
import jax.numpy as jnp


class SamplingMode(enum.IntEnum):
    """What a decode program must be able to do; a batch uses the most general mode any row needs.

    Each mode is one compiled program: greedy-only batches skip the random draws, and only batches
    with top-k/top-p pay for sorting the vocabulary.
    """

    GREEDY = 0
    TEMPERATURE = 1
    FILTERED = 2


def prompt_key_id(prompt_id: int | str) -> int:
    """A prompt id as the 31-bit integer folded into its keys (strings hash stably with CRC-32)."""
    if isinstance(prompt_id, str):
        return zlib.crc32(prompt_id.encode("utf-8")) & 0x7FFFFFFF
    if isinstance(prompt_id, int) and prompt_id >= 0:
        return prompt_id & 0x7FFFFFFF
    raise ValueError(f"prompt id must be a string or a non-negative int, got {prompt_id!r}")


def sample_key(seed: jax.Array, prompt_id: jax.Array, sample_index: jax.Array, token_index: jax.Array) -> jax.Array:
    """The key of one token of one sample (all arguments int32 scalars; vmap for a batch)."""
    key = jax.random.key(seed.astype(jnp.uint32))
    for part in (prompt_id, sample_index, token_index):
        key = jax.random.fold_in(key, part.astype(jnp.uint32))
    return key


def token_draws(seed: jax.Array, prompt_id: jax.Array, sample_index: jax.Array, first_token: jax.Array,
                count: int) -> jax.Array:
    """[B, count] float32: the uniform draw of tokens ``first_token[b] + j`` of each row's sample,
    ``uniform(sample_key(...))``, the one random number a token takes (``sample_tokens``).

    A decode loop computes them all before its first step: one batched pass of the key hash
    instead of two small ones inside every step, which XLA:CPU runs as loops of their own (about
    5% of a stories260K decode step in its profile). The values are the per-token keys', so a token
    stays a function of its (seed, prompt id, sample index, position) alone.
    """
    def row(seed, prompt_id, sample_index, first):
        keys = jax.vmap(lambda j: sample_key(seed, prompt_id, sample_index, first + j))(jnp.arange(count))
        return jax.vmap(jax.random.uniform)(keys)

    return jax.vmap(row)(seed, prompt_id, sample_index, first_token)


def token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """float32 log_softmax of the raw logits [B, V] at ``tokens`` [B]."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def greedy_tokens(logits: jax.Array) -> jax.Array:
    """The argmax of each row (the lowest index on ties) as two plain reductions.

    ``jnp.argmax`` lowers to a variadic (value, index) reduction that the CPU backend does not
    vectorise; over a 32k vocabulary it cost a tenth of a decode step.
    """
    top = logits.max(axis=-1, keepdims=True)
    index = jnp.arange(logits.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(logits == top, index, logits.shape[-1]), axis=-1).clip(max=logits.shape[-1] - 1)


def _largest_threshold(enough: Callable[[jax.Array], jax.Array], upper: jax.Array) -> jax.Array:
    """Per row, the largest uint32 ``t`` in [0, upper) with ``enough(t)`` true, by bisection.

    ``enough`` must be monotone (true up to some t, false above) and true at 0. 32 halvings of the
    uint32 range find it exactly; each is one pass over the vocabulary, where a sort is a log-depth
    network of them (two orders of magnitude slower on CPU for a 32k vocabulary).
    """
    def halve(_, bounds):
        low, high = bounds  # enough(low) holds; enough(high) fails or high == upper
        middle = low + (high - low) // 2
        ok = enough(middle)
        return jnp.where(ok, middle, low), jnp.where(ok, high, middle)

    low, _ = jax.lax.fori_loop(0, 32, halve, (jnp.zeros_like(upper), upper))
    return low


def _sortable(x: jax.Array) -> jax.Array:
    """float32 -> uint32 with the same order (negative floats have their bits flipped)."""
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _filter_mask(scaled: jax.Array, probs: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Tokens allowed by top-k (of the tempered logits) and by the nucleus of the tempered distribution.

    Nucleus: the smallest set of most probable tokens whose mass reaches ``top_p`` (the most
    probable token always). Both are thresholds found by bisection; tokens tied with the last one
    admitted are admitted too.
    """
    order = _sortable(scaled)
    kth = _largest_threshold(lambda t: (order >= t[:, None]).sum(-1) >= top_k, order.max(-1) + 1)
    mass_bits = jax.lax.bitcast_convert_type(probs, jnp.uint32)  # probabilities are >= 0: bits sort as values
    nucleus = _largest_threshold(lambda t: jnp.where(mass_bits >= t[:, None], probs, 0.0).sum(-1) >= top_p,
                                 mass_bits.max(-1) + 1)
    in_top_k = (top_k[:, None] == 0) | (order >= kth[:, None])
    in_nucleus = (top_p[:, None] >= 1.0) | (mass_bits >= nucleus[:, None])
    return in_top_k & in_nucleus


def _inverse_cdf_draw(draws: jax.Array, weights: jax.Array) -> jax.Array:
    """One token per row with probability proportional to ``weights`` [B, V] (>= 0), from the row's
    uniform draw in ``draws`` [B].

    Two levels, blocks of about sqrt(V) tokens: pick a block by the cumulative block masses, then a
    token by the cumulative masses inside it. A Gumbel-max draw needs V random numbers per row and
    a full cumulative sum is sequential; this reads the weights twice and draws one number.
    """
    batch, vocab = weights.shape
    block = max(8, 1 << math.ceil(math.log2(math.sqrt(vocab))))
    blocks = jnp.pad(weights, ((0, 0), (0, -vocab % block))).reshape(batch, -1, block)
    block_mass = blocks.sum(-1)
    block_cdf = jnp.cumsum(block_mass, axis=-1)
    target = draws * block_cdf[:, -1]
    chosen = jnp.minimum((block_cdf <= target[:, None]).sum(-1), blocks.shape[1] - 1)
    within = target - jnp.take_along_axis(block_cdf - block_mass, chosen[:, None], axis=-1)[:, 0]
    row = jnp.take_along_axis(blocks, chosen[:, None, None], axis=1)[:, 0]
    offset = (jnp.cumsum(row, axis=-1) <= within[:, None]).sum(-1)
    # Rounding can push the target past the block's last token of non-zero weight: take that one.
    last_positive = jnp.max(jnp.where(row > 0, jnp.arange(block), 0), axis=-1)
    return (chosen * block + jnp.minimum(offset, last_positive)).astype(jnp.int32)


def sample_tokens(logits: jax.Array, draws: jax.Array, temperature: jax.Array, top_k: jax.Array, top_p: jax.Array,
                  mode: SamplingMode) -> tuple[jax.Array, jax.Array]:
    """Pick one token per row of ``logits`` [B, V]; return (tokens [B] int32, log-probs [B] float32).

    Rows with temperature 0 are greedy in every mode. ``draws`` [B] are the rows' uniform draws in
    [0, 1) (``token_draws``); each row's token depends only on its own draw and logits.
    """
    logits = logits.astype(jnp.float32)
    greedy = greedy_tokens(logits)
    if mode == SamplingMode.GREEDY:
        return greedy, token_logprobs(logits, greedy)
    scaled = logits / jnp.where(temperature > 0, temperature, 1.0)[:, None]
    weights = jnp.exp(scaled - scaled.max(axis=-1, keepdims=True))
    if mode == SamplingMode.FILTERED:
        weights = jnp.where(_filter_mask(scaled, weights / weights.sum(-1, keepdims=True), top_k, top_p), weights, 0.0)
    tokens = jnp.where(temperature > 0, _inverse_cdf_draw(draws, weights), greedy)
    return tokens, token_logprobs(logits, tokens)
