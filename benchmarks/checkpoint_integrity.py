"""Checkpoint integrity: save and restore with the seal (digests written, then checked) against orbax alone.

A train state shaped as a trainer's (parameters + Adam's two moments, float32, in arrays of
``--array-mib`` each) of ``--state-gib`` in all is saved and restored, in the same run and folder:

  orbax_*    orbax's CheckpointManager as a careful user runs it: asynchronous save, the same items
             (state + ledger), restore into the same target (shapes, dtypes, shardings); no digests
  rlax_*     ``rlax_core.training.checkpoint.Checkpointer``: the same orbax save, plus the array digests
             queued on the devices, the seal (inventory, SHA-256 of the small files) written in the
             background thread; restore checks files, arrays and ledger before it returns

  *_blocking_s   how long ``save`` holds the training loop
  *_save_s       save until the checkpoint is on disk (rlax: sealed), ``wait()`` included
  *_restore_s    a fresh Checkpointer / manager: restore until the state is on the devices (rlax: verified)
  digest_gb_per_s    the array digests alone, per device, over the whole state (what a save and a
                     restore add on the devices)

Extrapolation to a 7B state (printed under ``seven_b``): the digests cost one read of the state in
the devices' memory and a few integer operations per 32-bit word, per device over its own shards,
so their time is the state's bytes per device over the per-device throughput measured here; the
host's share (listing the files, hashing those up to 16 MiB, writing the seal) grows with the
number of files, not with the state's size. The projection assumes every device digests no faster
than this CPU's one JAX device does, which is pessimistic for an accelerator (its memory is ~100
times faster); it does not model the storage (orbax's own share, which the seal does not change).

    python benchmarks/checkpoint_integrity.py                   # a 1 GiB state, local temp folder
    python benchmarks/checkpoint_integrity.py --state-gib 4     # bigger, if the machine has the memory
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orbax.checkpoint as ocp  # noqa: E402

from rlax_core.data.rollout_store import GroupKey  # noqa: E402
from rlax_core.training.checkpoint import Checkpointer, abstract_like  # noqa: E402
from rlax_core.training.checkpoint_integrity import digest_strings, start_array_digests  # noqa: E402
from rlax_core.training.ledger import DataLedger  # noqa: E402

# Qwen2.5-7B: 7.62e9 parameters; a trainer holds them in float32 with Adam's mu and nu beside them.
SEVEN_B_PARAMETERS = 7.62e9
SEVEN_B_STATE_BYTES = SEVEN_B_PARAMETERS * 4 * 3
SEVEN_B_DEVICES = (1, 8, 64)  # one device, a v5e-8 host, a 64-chip slice


def make_state(state_gib: float, array_mib: float, seed: int = 0):
    """params / mu / nu, each a third of the state, in float32 arrays of about ``array_mib`` each."""
    elements = int(array_mib * (1 << 20) / 4)
    columns = 1024
    rows = max(1, elements // columns)
    per_part = max(1, round(state_gib * (1 << 30) / 3 / (rows * columns * 4)))
    key = jax.random.key(seed)

    def part(offset):
        return {f"w{i}": jax.random.normal(jax.random.fold_in(key, offset + i), (rows, columns), jnp.float32)
                for i in range(per_part)}

    state = {"params": part(0), "opt_state": {"mu": part(1000), "nu": part(2000)}, "step": jnp.int32(100)}
    jax.block_until_ready(state)
    return state


def state_bytes(state) -> int:
    return sum(leaf.nbytes for leaf in jax.tree.leaves(state))


def orbax_round(state, ledger, folder: str) -> dict[str, float]:
    options = ocp.CheckpointManagerOptions(max_to_keep=None, enable_async_checkpointing=True, create=True)
    manager = ocp.CheckpointManager(folder, options=options, item_names=("state", "ledger"))
    started = time.perf_counter()
    manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            ledger=ocp.args.JsonSave(ledger.to_json())))
    blocking = time.perf_counter() - started
    manager.wait_until_finished()
    saved = time.perf_counter() - started
    manager.close()
    fresh = ocp.CheckpointManager(folder, options=options, item_names=("state", "ledger"))
    started = time.perf_counter()
    restored = fresh.restore(1, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_like(state)),
                                                        ledger=ocp.args.JsonRestore()))
    jax.block_until_ready(restored.state)
    restore = time.perf_counter() - started
    fresh.close()
    return {"blocking_s": blocking, "save_s": saved, "restore_s": restore}


def rlax_round(state, ledger, folder: str) -> dict[str, float]:
    checkpointer = Checkpointer(folder, keep=1)
    started = time.perf_counter()
    checkpointer.save(1, state, ledger)
    blocking = time.perf_counter() - started
    checkpointer.wait()
    saved = time.perf_counter() - started
    checkpointer.close()
    fresh = Checkpointer(folder)
    started = time.perf_counter()
    restored, _ = fresh.restore(1, abstract_like(state))
    jax.block_until_ready(restored)
    restore = time.perf_counter() - started
    fresh.close()
    return {"blocking_s": blocking, "save_s": saved, "restore_s": restore}


def digest_seconds(state, repeats: int) -> float:
    _, digests = start_array_digests(state)  # compiles
    digest_strings(digests)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        digest_strings(start_array_digests(state)[1])
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-gib", type=float, default=1.0, help="size of the train state saved")
    parser.add_argument("--array-mib", type=float, default=64.0, help="size of each array of it")
    parser.add_argument("--rounds", type=int, default=2, help="save + restore rounds of each; the best is kept")
    parser.add_argument("--root", help="folder to write to (default: a temporary folder)")
    args = parser.parse_args(argv)

    state = make_state(args.state_gib, args.array_mib)
    ledger = DataLedger(consumed=[GroupKey(s, i) for s in range(100) for i in range(64)])
    root = Path(args.root or tempfile.mkdtemp(prefix="rlax-ckpt-bench-"))
    results: dict[str, dict[str, float]] = {"orbax": {}, "rlax": {}}
    try:
        for round_ in range(args.rounds):
            for name, run in (("orbax", orbax_round), ("rlax", rlax_round)):  # alternated: the same page cache
                folder = root / f"{name}-{round_}"
                measured = run(state, ledger, str(folder))
                for key, value in measured.items():
                    results[name][key] = min(results[name].get(key, value), value)
                shutil.rmtree(folder)
        digest_s = digest_seconds(state, repeats=args.rounds)
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)

    size = state_bytes(state)
    devices = len({device for leaf in jax.tree.leaves(state) for device in leaf.devices()})
    per_device_gb_s = size / 1e9 / digest_s / devices
    report = {
        "state_gib": size / (1 << 30), "arrays": len(jax.tree.leaves(state)), "platform": jax.default_backend(),
        "orbax": results["orbax"], "rlax": results["rlax"],
        "ratios": {key: results["rlax"][key] / results["orbax"][key] for key in ("blocking_s", "save_s", "restore_s")},
        "devices": devices, "digest_s": digest_s, "digest_gb_per_s_per_device": per_device_gb_s,
        "seven_b": {
            "state_gb": SEVEN_B_STATE_BYTES / 1e9,
            "how": "params + Adam mu, nu in float32; digest time = state bytes per device / the per-device "
                   "throughput measured here (this CPU's device: pessimistic for accelerators)",
            "digest_s_by_devices": {str(n): SEVEN_B_STATE_BYTES / n / 1e9 / per_device_gb_s for n in SEVEN_B_DEVICES},
        },
        "load_average": list(os.getloadavg()),
    }
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
