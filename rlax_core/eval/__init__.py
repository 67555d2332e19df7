"""Evaluation: metrics over sampled completions (``metrics``, ``report``, ``verify``: pure functions, no
model and no Beam), and a policy's held-out evaluation on the engine (``policy``: pass@k with its
standard error, reward and fluency)."""

from rlax_core.eval.metrics import maj_at_k, mean_at_n, pass_at_k, summarize_prompts

__all__ = ["maj_at_k", "mean_at_n", "pass_at_k", "summarize_prompts"]
