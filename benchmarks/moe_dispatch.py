"""Expert-parallel dispatch on the 8 simulated CPU devices: gather + reduce-scatter against all-to-all, in one run.

One sparse layer's forward and backward (the experts' gradient and the tokens'), float32, experts split
over an ``expert`` mesh axis of ``--devices`` devices that also splits the tokens, dropless:

  gather          ``models.moe.expert_parallel`` (what the model runs): tokens all-gathered over the
                  expert axis, each device runs its experts on the copies routed to them, the outputs
                  reduce-scattered back
  all_to_all      each device sends each token copy to the device holding its expert and gets the
                  output back, two ``all_to_all``s of fixed shape; without dropping tokens a device must
                  reserve room for all its copies at every peer (k x the gather's rows)
  auto            no shard_map: the unsharded ``run_experts`` under jit with the same shardings, XLA's
                  SPMD partitioner placing the sort and the grouped products itself

``seconds`` are the best of interleaved repeats (benchmarks/forward.py); ``vs_gather`` is each one's
time over the gather's. Every contender's outputs and gradients are checked against one device's
within 1e-5 first. Prints one JSON object; XLA_FLAGS gets the device count before JAX loads.

    python benchmarks/moe_dispatch.py
    python benchmarks/moe_dispatch.py --tokens 64 --repeats 1     # seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _devices_flag(argv) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--devices", type=int, default=8)
    return parser.parse_known_args(argv)[0].devices


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=8, help="simulated CPU devices = the expert axis")
    parser.add_argument("--tokens", type=int, default=1024, help="tokens in the batch (split over the devices)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--expert-width", type=int, default=256)
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--experts-per-token", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if "jax" not in sys.modules:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                                   f" --xla_force_host_platform_device_count={args.devices}").strip()
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from forward import best_times_interleaved

    from rlax_core.models.moe import expert_parallel, run_experts
    from rlax_core.parallel import MeshConfig, make_mesh

    if jax.device_count() < args.devices:
        raise SystemExit(f"--devices {args.devices}: JAX sees {jax.device_count()} (it was loaded before the flag)")
    mesh = make_mesh(MeshConfig(fsdp=1, expert=args.devices), jax.devices()[:args.devices])
    keys = jax.random.split(jax.random.key(0), 6)
    e, f, n, k = args.hidden, args.expert_width, args.experts, args.experts_per_token
    x = jax.random.normal(keys[0], (args.tokens, 1, e))
    ids = jax.vmap(lambda key: jax.random.choice(key, n, (k,), replace=False))(
        jax.random.split(keys[1], args.tokens))[:, None]
    weights = jax.nn.softmax(jax.random.normal(keys[2], (args.tokens, 1, k)), axis=-1)
    gate, up = (jax.random.normal(key, (n, e, f)) / e ** 0.5 for key in keys[3:5])
    down = jax.random.normal(keys[5], (n, f, e)) / f ** 0.5

    def on_one_device(x, gate, up, down):
        return run_experts(x.reshape(-1, e), ids.reshape(-1, k), weights.reshape(-1, k), gate, up, down).reshape(x.shape)

    def gathered(x, gate, up, down):
        return expert_parallel(x, ids, weights, gate, up, down, mesh)

    def all_to_all(x, gate, up, down):
        return _all_to_all_experts(x, ids, weights, gate, up, down, mesh)

    def loss_and_grads(layer):
        return jax.jit(jax.value_and_grad(lambda x, g, u, d: jnp.sum(jnp.sin(layer(x, g, u, d))), argnums=(0, 1, 2, 3)))

    tokens_sharding = NamedSharding(mesh, PartitionSpec("expert", None, None))
    experts_sharding = NamedSharding(mesh, PartitionSpec("expert", None, None))
    operands = (jax.device_put(x, tokens_sharding), *(jax.device_put(w, experts_sharding) for w in (gate, up, down)))
    reference = loss_and_grads(on_one_device)(x, gate, up, down)
    contenders = {"gather": loss_and_grads(gathered), "all_to_all": loss_and_grads(all_to_all),
                  "auto": loss_and_grads(on_one_device)}
    for name, program in contenders.items():
        value, grads = program(*operands)
        for ours, theirs in zip(jax.tree.leaves((value, grads)), jax.tree.leaves(reference)):
            np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), atol=1e-5 * max(1.0, float(np.abs(theirs).max())),
                                       err_msg=name)
    seconds = best_times_interleaved([lambda p=p: jax.block_until_ready(p(*operands)) for p in contenders.values()],
                                     args.repeats)
    timed = dict(zip(contenders, seconds))
    report = {"devices": args.devices, "tokens": args.tokens, "hidden": e, "expert_width": f, "experts": n,
              "experts_per_token": k, "seconds": timed,
              "vs_gather": {name: value / timed["gather"] for name, value in timed.items()},
              "load_average": list(os.getloadavg())}
    print(json.dumps(report, indent=2))
    return report


def _all_to_all_experts(x, ids, weights, gate, up, down, mesh):
    """The all-to-all dispatch, dropless with fixed shapes: every device reserves, at every peer, room
    for all of its own token copies (any of them may be routed there)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    from rlax_core.models.moe import EXPERT_AXIS, run_experts

    devices = mesh.shape[EXPERT_AXIS]
    local_experts = gate.shape[0] // devices
    tokens = PartitionSpec(EXPERT_AXIS, None, None)
    experts = PartitionSpec(EXPERT_AXIS, None, None)

    def local(x, ids, weights, gate, up, down):
        shape = x.shape
        x, ids, weights = x.reshape(-1, x.shape[-1]), ids.reshape(-1, ids.shape[-1]), weights.reshape(-1, ids.shape[-1])
        count, k = ids.shape
        copies = count * k
        destination = ids.reshape(-1) // local_experts
        order = jnp.argsort(destination, stable=True)
        starts = jnp.searchsorted(destination[order], jnp.arange(devices))
        slot = jnp.arange(copies) - starts[destination[order]]  # rank of each sorted copy at its destination
        send = jnp.zeros((devices, copies, x.shape[-1]), x.dtype).at[destination[order], slot].set(x[order // k])
        send_ids = jnp.full((devices, copies), local_experts, jnp.int32).at[destination[order], slot].set(
            ids.reshape(-1)[order] % local_experts)
        received = jax.lax.all_to_all(send, EXPERT_AXIS, 0, 0, tiled=True)
        received_ids = jax.lax.all_to_all(send_ids, EXPERT_AXIS, 0, 0, tiled=True)
        out = run_experts(received.reshape(-1, x.shape[-1]), received_ids.reshape(-1, 1),
                          jnp.ones((devices * copies, 1), x.dtype), gate, up, down)
        back = jax.lax.all_to_all(out.reshape(devices, copies, -1), EXPERT_AXIS, 0, 0, tiled=True)
        per_copy = jnp.zeros((copies, x.shape[-1]), x.dtype).at[order].set(back[destination[order], slot])
        return jnp.einsum("nkh,nk->nh", per_copy.reshape(count, k, -1), weights).reshape(shape)

    return jax.shard_map(local, mesh=mesh, check_vma=False, in_specs=(tokens, tokens, tokens, experts, experts, experts),
                         out_specs=tokens)(x, ids, weights, gate, up, down)


if __name__ == "__main__":
    main()
