"""Evaluation metrics over sampled completions: pure functions, no model and no Beam."""

from rlax_core.eval.metrics import maj_at_k, mean_at_n, pass_at_k, summarize_prompts

__all__ = ["maj_at_k", "mean_at_n", "pass_at_k", "summarize_prompts"]
