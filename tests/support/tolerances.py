"""Tolerances from the arithmetic, not from one machine.

Two float32 computations of the same log-prob that add in different orders (a prefill recomputed
after a preemption against incremental decode steps; XLA's CPU code with and without AVX-512, whose
vector widths split a reduction differently) differ by rounding alone. A sum of ``n`` terms has a
forward error of at most ``gamma_n = n*u/(1 - n*u)`` times the sum of the terms' magnitudes
(Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2; ``u`` = eps/2), so two
orders of the same sum differ by at most about ``n * eps`` of it. A decoder stacks ``depth`` such sums
on a token's path to its logits, each carrying the error of the one before. A log-softmax moves by at
most twice the largest change of a logit.

The bound is a worst case. A test that sets it still compares every token exactly; the bound only says
how far a float may move without a token changing.
"""

from __future__ import annotations

import numpy as np


def reordered_sum_bound(terms: int, depth: int = 1, dtype=np.float32) -> float:
    """Relative bound on the difference of two evaluations of ``depth`` chained sums of at most ``terms``
    terms each, added in different orders in ``dtype``: ``depth * terms * eps``."""
    return float(depth * terms * np.finfo(dtype).eps)


def decoder_logit_bound(config, context: int) -> float:
    """The bound for a decoder's float32 logits (``rlax_core.models.config.ModelConfig``): its widest
    sum (the MLP's hidden width, the model width, or the attended context) on each of its layers."""
    terms = max(config.intermediate_size, config.hidden_size, context)
    return reordered_sum_bound(terms, depth=config.num_layers)


def decoder_logprob_bound(config, context: int) -> float:
    """The bound for a decoder's float32 log-probs: its logits' bound and the log-softmax's doubling."""
    return 2 * decoder_logit_bound(config, context)


def assert_reordered_close(actual, expected, bound: float) -> None:
    """Two float32 evaluations of the same values within ``bound`` of the value (and of 1 near zero)."""
    np.testing.assert_allclose(actual, expected, rtol=bound, atol=bound)
