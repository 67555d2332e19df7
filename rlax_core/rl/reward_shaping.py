"""DAPO's overlong reward shaping (Yu et al. 2025, §3.4, eq. 13): the one implementation in the repo,
applied by the rollout stream to every scored group as ``algorithm.overlong_*`` say
(``rlax_core.rollout.groups.shape_overlong``).

A completion longer than ``max_length - cache_length`` is penalised linearly, reaching
``-penalty`` at ``max_length``; beyond ``max_length`` the penalty stays ``-penalty``::

    length <= L_max - L_cache            ->  0
    L_max - L_cache < length <= L_max    ->  penalty * ((L_max - L_cache) - length) / L_cache
    length > L_max                       ->  -penalty

The result is *added* to the task reward. It is a pure function of lengths, written with
``jax.numpy`` so that it works on numpy arrays and Python ints as well as inside jit.
"""

from __future__ import annotations

import jax.numpy as jnp


def overlong_penalty(lengths, max_length: int, cache_length: int, penalty: float = 1.0):
    """The soft overlong punishment for completion ``lengths`` (any shape); 0 when ``max_length`` is 0."""
    if max_length <= 0:
        return jnp.zeros(jnp.shape(lengths), jnp.float32)
    if not 0 <= cache_length <= max_length:
        raise ValueError(f"cache_length must be in [0, max_length={max_length}], got {cache_length}")
    lengths = jnp.asarray(lengths, jnp.float32)
    expected = max_length - cache_length
    inside_cache = penalty * (expected - lengths) / max(cache_length, 1)
    return jnp.where(lengths <= expected, 0.0, jnp.where(lengths <= max_length, inside_cache, -penalty))
