"""Per-token estimators of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL divergence", 2020).

With ``log_r = ref_logprobs - logprobs`` at a token sampled from ``pi``:

* ``k1 = -log_r``                    unbiased, high variance, can be negative;
* ``k2 = log_r ** 2 / 2``            biased, low variance, always >= 0;
* ``k3 = exp(log_r) - 1 - log_r``    unbiased, low variance, always >= 0 (GRPO's choice).

All three are 0 exactly when the two log-probs are equal, and all are differentiable in
``logprobs`` (the gradient of the KL term flows through the current policy only).
"""

from __future__ import annotations

import jax.numpy as jnp

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_estimate(logprobs: jnp.ndarray, ref_logprobs: jnp.ndarray, estimator: str = "k3") -> jnp.ndarray:
    """Per-token estimate of KL(pi || pi_ref) with ``logprobs`` of the sampled tokens under pi."""
    log_r = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * jnp.square(log_r)
    if estimator == "k3":
        return jnp.expm1(log_r) - log_r
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {', '.join(KL_ESTIMATORS)}")
