"""Checkpoints through orbax's CheckpointManager: the train state and the data ledger, together.

One checkpoint holds parameters, optimizer state, step and RNG (one pytree, ``state``) and the data
ledger (JSON, ``ledger``). Orbax writes both into a temporary folder and renames it when both are
complete, so ``latest_step()`` only ever names a whole checkpoint; a process killed mid-save leaves
the previous one as the latest. Saves may run in the background (``async_save``) while training
continues; keep-N garbage-collects older ones.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from rlax_core.training.ledger import DataLedger
from rlax_core.utils.paths import is_remote

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, directory: str | Path, *, keep: int = 3, async_save: bool = True):
        # orbax wants absolute paths; URLs (gs://...) pass through.
        local = str(directory).removeprefix("file://")
        self.directory = str(directory) if is_remote(directory) else os.path.abspath(local)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "ledger"))

    def latest_step(self) -> int | None:
        self._manager.reload()
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        """The steps of every complete checkpoint, oldest first."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def save(self, step: int, state: Any, ledger: DataLedger) -> None:
        """Start saving (returns before the write ends when async); a later save waits for it."""
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         ledger=ocp.args.JsonSave(ledger.to_json())))

    def restore(self, step: int, abstract_state: Any | None = None) -> tuple[Any, DataLedger]:
        """Load checkpoint ``step`` into the shapes, dtypes and shardings of ``abstract_state``.

        Without ``abstract_state`` the state comes back as saved, as a tree of plain containers
        (for inspecting a checkpoint; the trainer always passes its own target).
        """
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), ledger=ocp.args.JsonRestore()))
        return restored.state, DataLedger.from_json(restored.ledger)

    def wait(self) -> None:
        """Block until background saves are on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of a tree of arrays: the restore target."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
