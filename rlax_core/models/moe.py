"""The sparse feed-forward of Qwen2-MoE and Qwen3-MoE: a softmax top-k router over stacked SwiGLU experts.

    logits  = x @ W_router                                  float32 [tokens, experts]
    p       = softmax(logits)
    ids     = top_k(p)            or the ids given (router replay: the engine's choices, in the trainer)
    w       = p[ids]              / sum(p[ids]) when normalize_top_k
    y       = sum_j w_j * SwiGLU_{ids_j}(x)   (+ sigmoid(x @ w_shared) * SwiGLU_shared(x), Qwen2-MoE)

Replay changes only which experts run: their weights are still the router's own probabilities, so the
gradient reaches the router through the experts chosen, as R3 ("router replay") prescribes.

No token is dropped: each token's k copies are sorted by expert and the experts run as grouped matrix
products (``jax.lax.ragged_dot``) over groups of whatever size the router made; there is no capacity
factor. XLA:CPU runs a grouped product as one masked product per group (measured: 12.7x a dense product
of the same rows at 8 groups), so on CPU it costs about ``num_experts`` times its useful work; TPU and
GPU have real grouped kernels. Megablox's TPU kernel (``jax.experimental.pallas.ops.tpu.megablox.gmm``)
would take the same sorted rows and group sizes, but needs the row count padded to its row tile and
K, N multiples of 128, and its own ``tgmm`` for the weights' gradient; ``grouped_matmul`` is the one
place to put it.

Expert parallelism (``mesh`` with an ``expert`` axis): each device holds ``num_experts / expert`` of
the experts. Its tokens are gathered over the ``expert`` axis, each device runs its own experts on
every copy routed to them, and a reduce-scatter sums the outputs back to the tokens' devices. Why a
gather and not an all-to-all: without dropping tokens a fixed-shape all-to-all must reserve every
token's k copies for every peer (k x the gather's bytes), and on the simulated 8-device CPU mesh the
gather ran fastest at 1,024 tokens (``benchmarks/moe_dispatch.py``; docs/models.md has the figures).

The router's summaries over the real tokens (``Routing``) feed the optional auxiliary losses:
``load_balancing_loss`` (Switch Transformer) and ``router_z_loss`` (ST-MoE). They are sums, so the
trainer may add them over micro-batches before dividing.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec

from rlax_core.models.config import INIT_STDDEV, ModelConfig, MoeConfig
from rlax_core.parallel.mesh import BATCH_AXES

EXPERT_AXIS = "expert"  # the mesh axis that splits the experts
TENSOR_AXIS = "tensor"  # the mesh axis that splits each expert's hidden units


class Routing(NamedTuple):
    """What the router did, per sparse layer (a leading ``[moe_layers]`` axis when stacked by the forward).

    ``expert_ids`` [..., B, T, k] are the experts each token ran, as ``MoeConfig.expert_id_dtype``
    (uint8 up to 256 experts): what an engine records and a trainer replays. The rest are sums over
    the real tokens (padding excluded), float32: ``tokens`` [...], ``expert_counts`` [..., E] the
    copies sent to each expert (k per token), ``probability_sums`` [..., E] the router's probability
    of each expert, ``logsumexp_squares`` [...] the squared log-partition of the router's logits.
    """

    expert_ids: jax.Array
    tokens: jax.Array
    expert_counts: jax.Array
    probability_sums: jax.Array
    logsumexp_squares: jax.Array


def load_balancing_loss(routing: Routing) -> jax.Array:
    """Switch Transformer's auxiliary loss, ``E * sum_e f_e * P_e`` (f: share of the copies sent to
    expert e, P: its mean router probability), averaged over the sparse layers: 1.0 when the router
    spreads tokens evenly, up to E when it sends everything to one expert. Differentiable through P."""
    tokens = jnp.maximum(routing.tokens, 1.0)[..., None]
    share = routing.expert_counts / jnp.maximum(jnp.sum(routing.expert_counts, axis=-1, keepdims=True), 1.0)
    mean_probability = routing.probability_sums / tokens
    num_experts = routing.expert_counts.shape[-1]
    return jnp.mean(num_experts * jnp.sum(share * mean_probability, axis=-1))


def router_z_loss(routing: Routing) -> jax.Array:
    """ST-MoE's router z-loss: the mean over real tokens of ``logsumexp(router logits)^2``, averaged
    over the sparse layers. It keeps the router's logits small, where float32 rounding cannot tip a
    near-tie between experts."""
    return jnp.mean(routing.logsumexp_squares / jnp.maximum(routing.tokens, 1.0))


def route(logits: jax.Array, moe: MoeConfig, expert_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """(ids [..., k] int32, weights [..., k] float32) from float32 router ``logits`` [..., E].

    ``expert_ids`` given: those experts, weighted by this router's probabilities of them (an id outside
    [0, E) gets a NaN weight, so a corrupt replay shows in the logits instead of passing silently).
    """
    probabilities = jax.nn.softmax(logits, axis=-1)
    if expert_ids is None:
        _, ids = jax.lax.top_k(probabilities, moe.experts_per_token)
    else:
        if expert_ids.shape != (*logits.shape[:-1], moe.experts_per_token):
            raise ValueError(f"expert_ids: shape {tuple(expert_ids.shape)}, expected "
                             f"{(*logits.shape[:-1], moe.experts_per_token)} (tokens x experts_per_token)")
        ids = expert_ids.astype(jnp.int32)
    # One gather for both paths: the weights' gradient reaches the router through the chosen experts.
    weights = jnp.take_along_axis(probabilities, ids, axis=-1, mode="fill", fill_value=jnp.nan)
    if moe.normalize_top_k:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return ids, weights


def summarize(logits: jax.Array, ids: jax.Array, real: jax.Array, moe: MoeConfig) -> Routing:
    """The ``Routing`` of one layer: ``logits`` [B, T, E] float32, ``ids`` [B, T, k], ``real`` [B, T] bool."""
    weight = real.astype(jnp.float32)
    counts = jax.ops.segment_sum(jnp.broadcast_to(weight[..., None], ids.shape).reshape(-1), ids.reshape(-1),
                                 moe.num_experts)
    probabilities = jax.nn.softmax(logits, axis=-1)
    return Routing(
        expert_ids=ids.astype(moe.expert_id_dtype),
        tokens=jnp.sum(weight),
        expert_counts=jax.lax.stop_gradient(counts),
        probability_sums=jnp.einsum("bte,bt->e", probabilities, weight),
        logsumexp_squares=jnp.sum(weight * jnp.square(jax.nn.logsumexp(logits, axis=-1))))


def grouped_matmul(rows: jax.Array, weights: jax.Array, group_sizes: jax.Array) -> jax.Array:
    """rows [M, K] sorted by group, weights [G, K, N], group_sizes [G] -> [M, N]; rows past the groups' sum are 0."""
    return jax.lax.ragged_dot(rows, weights, group_sizes)


def run_experts(x: jax.Array, ids: jax.Array, weights: jax.Array, gate: jax.Array, up: jax.Array,
                down: jax.Array) -> jax.Array:
    """sum_j weights_j * SwiGLU_{ids_j}(x) for tokens x [N, H], ids and weights [N, k], experts' kernels
    gate/up [G, H, F] and down [G, F, H]. An id outside [0, G) runs no expert (it is another device's)."""
    tokens, k = ids.shape
    num_groups = gate.shape[0]
    flat = ids.reshape(-1)
    flat = jnp.where((flat >= 0) & (flat < num_groups), flat, num_groups)  # strangers: one group past the last
    order = jnp.argsort(flat, stable=True)  # each token's k copies, grouped by expert; strangers last
    rows = x[order // k]
    group_sizes = jnp.bincount(flat, length=num_groups).astype(jnp.int32)  # strangers not counted
    hidden = nn.silu(grouped_matmul(rows, gate, group_sizes)) * grouped_matmul(rows, up, group_sizes)
    out = grouped_matmul(hidden, down, group_sizes)
    unsorted = jnp.zeros_like(out).at[order].set(out, unique_indices=True)
    return jnp.einsum("nkh,nk->nh", unsorted.reshape(tokens, k, -1), weights.astype(out.dtype))


def expert_parallel(x: jax.Array, ids: jax.Array, weights: jax.Array, gate: jax.Array, up: jax.Array,
                    down: jax.Array, mesh: Mesh) -> jax.Array:
    """``run_experts`` over ``mesh``: x [B, T, H], ids and weights [B, T, k]; experts split over the
    ``expert`` axis and their hidden units over ``tensor`` where those divide them, tokens over the
    batch axes that divide B. Returns [B, T, H] placed like x."""
    num_experts, _, hidden_units = gate.shape
    expert_split = mesh.shape[EXPERT_AXIS] > 1 and num_experts % mesh.shape[EXPERT_AXIS] == 0
    tensor_split = mesh.shape[TENSOR_AXIS] > 1 and hidden_units % mesh.shape[TENSOR_AXIS] == 0
    batch_axes, rows = [], x.shape[0]
    for axis in BATCH_AXES:
        if mesh.shape[axis] > 1 and rows % mesh.shape[axis] == 0:
            batch_axes.append(axis)
            rows //= mesh.shape[axis]
    gather = expert_split and EXPERT_AXIS in batch_axes  # tokens split over the experts' axis travel to them
    token_spec = PartitionSpec(tuple(batch_axes) or None, None, None)
    expert_axis, tensor_axis = (EXPERT_AXIS if expert_split else None), (TENSOR_AXIS if tensor_split else None)
    in_projection = PartitionSpec(expert_axis, None, tensor_axis)
    out_projection = PartitionSpec(expert_axis, tensor_axis, None)

    def local(x, ids, weights, gate, up, down):
        shape = x.shape
        if gather:
            x, ids, weights = (jax.lax.all_gather(a, EXPERT_AXIS, axis=0, tiled=True) for a in (x, ids, weights))
        if expert_split:
            ids = ids - jax.lax.axis_index(EXPERT_AXIS) * gate.shape[0]  # this device's experts: [0, G_local)
        flat = lambda a: a.reshape(-1, a.shape[-1])  # noqa: E731
        y = run_experts(flat(x), flat(ids), flat(weights), gate, up, down).reshape(x.shape)
        if tensor_split:
            y = jax.lax.psum(y, TENSOR_AXIS)
        if gather:
            return jax.lax.psum_scatter(y, EXPERT_AXIS, scatter_dimension=0, tiled=True).reshape(shape)
        return jax.lax.psum(y, EXPERT_AXIS) if expert_split else y

    return jax.shard_map(local, mesh=mesh, check_vma=False,
                         in_specs=(token_spec, token_spec, token_spec, in_projection, in_projection, out_projection),
                         out_specs=token_spec)(x, ids, weights, gate, up, down)


def _swiglu(x, gate, up, down):
    return (nn.silu(x @ gate) * (x @ up)) @ down


class SparseMoe(nn.Module):
    """A sparse layer's feed-forward: ``(x [B, T, H], real [B, T], expert_ids or None) -> (y, Routing)``."""

    config: ModelConfig
    param_dtype: Any = jnp.float32
    mesh: Mesh | None = None  # set: the experts run through ``expert_parallel`` over it

    @nn.compact
    def __call__(self, x: jax.Array, real: jax.Array, expert_ids: jax.Array | None = None):
        moe, hidden = self.config.moe, self.config.hidden_size

        def param(name, shape, *axes):
            init = nn.with_logical_partitioning(nn.initializers.normal(INIT_STDDEV), axes)
            return self.param(name, init, shape, self.param_dtype)

        # "router": no partition rule names it, so every device scores every expert.
        router = param("router", (hidden, moe.num_experts), "embed", "router")
        experts = moe.num_experts, moe.expert_intermediate_size
        gate = param("gate_proj", (experts[0], hidden, experts[1]), "expert", "embed", "mlp")
        up = param("up_proj", (experts[0], hidden, experts[1]), "expert", "embed", "mlp")
        down = param("down_proj", (experts[0], experts[1], hidden), "expert", "mlp", "embed")

        # Routing is a discrete choice that the engine and the trainer must make alike: the router's
        # logits are float32 whatever the compute dtype, where a bfloat16 rounding would tip near-ties.
        logits = jnp.einsum("bth,he->bte", x.astype(jnp.float32), router.astype(jnp.float32))
        ids, weights = route(logits, moe, expert_ids)
        if self.mesh is None:
            y = run_experts(x.reshape(-1, hidden), ids.reshape(-1, ids.shape[-1]),
                            weights.reshape(-1, ids.shape[-1]), gate, up, down).reshape(x.shape)
        else:
            y = expert_parallel(x, ids, weights, gate, up, down, self.mesh)
        if moe.shared_expert_intermediate_size:
            width = moe.shared_expert_intermediate_size
            shared = _swiglu(x, param("shared_gate_proj", (hidden, width), "embed", "mlp"),
                             param("shared_up_proj", (hidden, width), "embed", "mlp"),
                             param("shared_down_proj", (width, hidden), "mlp", "embed"))
            shared_gate = x @ param("shared_expert_gate", (hidden, 1), "embed", "router")
            y = y + nn.sigmoid(shared_gate) * shared
        return y.astype(x.dtype), summarize(logits, ids, real, moe)
