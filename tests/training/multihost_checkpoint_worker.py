"""One process of the multi-host checkpoint check: a state sharded over every process's devices is
saved (each process writes its shards, process 0 seals), restored and verified by every process;
then, once process 0 has flipped a bit in the checkpoint, every process refuses it alike.

    python multihost_checkpoint_worker.py DIR NUM_PROCESSES PROCESS_ID PORT
"""
import sys
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlax_core.training.checkpoint import Checkpointer, abstract_like
from rlax_core.training.checkpoint_integrity import CheckpointCorrupt
from rlax_core.training.ledger import DataLedger


def main(directory: str, num_processes: int, process_id: int, port: int) -> None:
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=num_processes,
                               process_id=process_id)
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    values = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 7
    sharded = NamedSharding(mesh, P("fsdp"))
    state = {"w": jax.make_array_from_callback(values.shape, sharded, lambda index: values[index]),
             "step": jax.device_put(np.int32(3), NamedSharding(mesh, P()))}
    assert not state["w"].is_fully_addressable  # each process holds only its rows

    checkpointer = Checkpointer(directory, async_save=True)
    checkpointer.save(3, state, DataLedger())
    checkpointer.close()
    restored, _ = Checkpointer(directory).restore(3, abstract_like(state))
    np.testing.assert_array_equal(multihost_utils.process_allgather(restored["w"], tiled=True), values)

    if process_id == 0:  # the chief damages a shard another process wrote
        data = max((p for p in Path(directory, "3", "state").rglob("*") if p.is_file() and "process_1" in str(p)),
                   key=lambda p: p.stat().st_size)
        damaged = bytearray(data.read_bytes())
        damaged[len(damaged) // 2] ^= 0x01
        data.write_bytes(bytes(damaged))
    multihost_utils.sync_global_devices("damaged")
    try:
        Checkpointer(directory).restore(3, abstract_like(state))
    except CheckpointCorrupt as error:
        print(f"refused: {error}")
    else:
        raise AssertionError("a damaged checkpoint restored")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
