"""One process of the multi-host check: one train step over a mesh of every process's devices.

    python multihost_worker.py STORE OUT NUM_PROCESSES PROCESS_ID PORT

With NUM_PROCESSES > 1 the processes join through ``jax.distributed`` (CPU collectives) and shard
the parameters over ``fsdp`` across processes; process 0 gathers the result and writes OUT (npz).
"""
import sys

import jax
import numpy as np
from jax.experimental import multihost_utils

from rlax_core.data.rollout_store import RolloutStore
from rlax_core.models import toy_config
from rlax_core.rl.presets import get_preset
from rlax_core.training.batching import make_batch
from rlax_core.parallel import MeshConfig, initialize_distributed, make_mesh
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.step import Trainer


def main(store_root: str, out: str, num_processes: int, process_id: int, port: int) -> None:
    distributed = dict(coordinator_address=f"localhost:{port}", num_processes=num_processes,
                       process_id=process_id) if num_processes > 1 else {}
    config = TrainerConfig(max_seq_len=16, mesh=MeshConfig(fsdp=-1, **distributed),
                           optimizer=OptimizerConfig(learning_rate=1e-3, eps=1e-4))
    initialize_distributed(config.mesh)
    assert jax.process_count() == num_processes
    trainer = Trainer(toy_config(), get_preset("dr_grpo"), config, make_mesh(config.mesh))
    store = RolloutStore(store_root, run="mh")
    batch = make_batch([store.read_group(key) for key in store.list_groups()], max_seq_len=16,
                       row_multiple=trainer.row_multiple)
    state, metrics = trainer.step(trainer.init_state(), batch)
    embedding = state.params["embed_tokens"]["embedding"]
    sharded_across_processes = len({d.process_index for d in embedding.sharding.device_set}) == num_processes \
        and not embedding.sharding.is_fully_replicated
    params = multihost_utils.process_allgather(state.params, tiled=True)
    if jax.process_index() == 0:
        flat = {jax.tree_util.keystr(path): np.asarray(leaf)
                for path, leaf in jax.tree_util.tree_leaves_with_path(params)}
        np.savez(out, loss=np.asarray(metrics["loss"]), devices=jax.device_count(),
                 sharded=sharded_across_processes, **flat)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
