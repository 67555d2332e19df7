"""Checkpoints through orbax's CheckpointManager: the train state and the data ledger, together, sealed.

One checkpoint holds parameters, optimizer state, step and RNG (one pytree, ``state``) and the data
ledger (JSON, ``ledger``). Orbax writes both into a temporary folder and renames it when both are
complete; then a background thread seals it (``checkpoint_integrity``: digests of every array, of
the ledger and of the files, written last). Only sealed checkpoints count: ``latest_step()`` names
the newest, a process killed mid-save leaves the previous one as the latest, and ``restore`` checks
the seal before it returns anything (``CheckpointCorrupt`` otherwise). Saves run in the background
(``async_save``) while training continues.

Collection keeps the newest ``keep`` sealed checkpoints; a checkpoint found corrupt is moved to
``refused/`` by :meth:`Checkpointer.restore_newest` and never counts as one of them, so collection
never removes the newest good one. On several hosts every process saves and restores (both are
collective); process 0 seals, collects and moves.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from rlax_core.models.checkpoint import CheckpointError
from rlax_core.training.checkpoint_integrity import (SEAL_NAME, CheckpointCorrupt, CheckpointUnsealed, Seal,
                                                     check_arrays, check_files, digest_strings, inventory,
                                                     ledger_digest, named_leaves, start_array_digests)
from rlax_core.training.ledger import DataLedger
from rlax_core.utils.paths import is_remote
from rlax_core.utils.storage import open_storage

log = logging.getLogger(__name__)
REFUSED = "refused"  # where restore_newest moves checkpoints that failed verification


class Checkpointer:
    def __init__(self, directory: str | Path, *, keep: int = 3, async_save: bool = True):
        if keep < 1:
            raise ValueError(f"keep: at least 1 checkpoint, got {keep}")
        # orbax wants absolute paths; URLs (gs://...) pass through.
        local = str(directory).removeprefix("file://")
        self.directory = str(directory) if is_remote(directory) else os.path.abspath(local)
        self.keep, self.async_save = keep, async_save
        # Collection is ours (max_to_keep=None): orbax's would count checkpoints that are not sealed.
        options = ocp.CheckpointManagerOptions(max_to_keep=None, enable_async_checkpointing=True, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "ledger"))
        self._storage = open_storage(self.directory)
        self._sealer = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-seal")  # the save's background thread
        self._sealing: list[Future] = []
        self._is_chief = jax.process_index() == 0

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def all_steps(self) -> list[int]:
        """The steps of every sealed checkpoint, oldest first."""
        return [step for step in self._numbered() if self._storage.exists(f"{step}/{SEAL_NAME}")]

    def _numbered(self) -> list[int]:
        """Every numbered folder, sealed or not, oldest first."""
        return sorted(int(name) for name in self._storage.list("") if name.isdigit())

    def save(self, step: int, state: Any, ledger: DataLedger) -> None:
        """Start saving (returns before the write ends when async); a later save waits for it and
        raises what went wrong with it."""
        self._raise_if_sealing_failed()
        # Queued on the devices before orbax copies the state out: the next train step may donate it.
        names, digests = start_array_digests(state)
        layouts = {name: {"shape": list(leaf.shape), "dtype": str(leaf.dtype)} for name, leaf in named_leaves(state)}
        ledger_json = ledger.to_json()  # a copy: the trainer goes on appending to the ledger
        self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                         ledger=ocp.args.JsonSave(ledger_json)))
        self._sealing.append(self._sealer.submit(self._seal, step, names, layouts, digests, ledger_json))
        if not self.async_save:
            self.wait()

    def _seal(self, step: int, names: list[str], layouts: dict, digests: jax.Array, ledger_json: dict) -> None:
        self._manager.wait_until_finished()  # orbax has committed the folder (or raises why not)
        if not self._is_chief:
            return
        arrays = {name: {**layouts[name], "digest": digest} for name, digest in zip(names, digest_strings(digests))}
        seal = Seal(step, arrays, ledger_digest(ledger_json), inventory(self._storage, str(step)))
        self._storage.write(f"{step}/{SEAL_NAME}", seal.to_bytes(), atomic=True)
        self._collect()

    def _collect(self) -> None:
        """Remove every numbered folder older than the newest ``keep`` sealed checkpoints."""
        sealed = self.all_steps()
        if len(sealed) <= self.keep:
            return
        oldest_kept = sealed[-self.keep]
        for step in self._numbered():
            if step < oldest_kept:
                self._storage.delete_tree(str(step))

    def _raise_if_sealing_failed(self) -> None:
        done = [future for future in self._sealing if future.done()]
        self._sealing = [future for future in self._sealing if not future.done()]
        for future in done:
            future.result()

    def restore(self, step: int, abstract_state: Any | None = None) -> tuple[Any, DataLedger]:
        """Load checkpoint ``step`` into the shapes, dtypes and shardings of ``abstract_state``, after
        checking its seal: ``CheckpointCorrupt`` names the file or array that differs.

        Without ``abstract_state`` the state comes back as saved, as a tree of plain containers
        (for inspecting a checkpoint; the trainer always passes its own target).
        """
        where = f"{self.directory.rstrip('/')}/{step}"
        try:
            seal = Seal.from_bytes(self._storage.read(f"{step}/{SEAL_NAME}"), where)
        except FileNotFoundError:
            if not self._storage.exists(str(step)):
                raise CheckpointError(f"{where}: no such checkpoint") from None
            raise CheckpointUnsealed(f"{where}: not sealed (its save did not finish)") from None
        if seal.step != step:
            raise CheckpointCorrupt(f"{where}: its seal is for step {seal.step}")
        check_files(seal, self._storage, str(step), where)
        target = None if abstract_state is None else _as_saved(abstract_state, seal, where)
        self._manager.reload()
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target), ledger=ocp.args.JsonRestore()))
        except Exception as error:  # noqa: BLE001 - whatever orbax or tensorstore raise: the cause, one line
            raise CheckpointCorrupt(f"{where}: cannot be read ({_first_line(error)})") from error
        check_arrays(seal, restored.state, where)
        if ledger_digest(restored.ledger) != seal.ledger:
            raise CheckpointCorrupt(f"{where}: the data ledger differs from its digest in the seal")
        state = restored.state
        if abstract_state is not None:  # verified as saved; now in the dtypes asked for
            state = jax.tree.map(lambda x, a: x if x.dtype == a.dtype else x.astype(a.dtype), state, abstract_state)
        return state, DataLedger.from_json(restored.ledger)

    def restore_newest(self, abstract_state: Any) -> tuple[int, Any, DataLedger] | None:
        """The newest checkpoint that passes :meth:`restore`, as ``(step, state, ledger)``; None when
        there is none at all (or only saves that did not finish). Newer ones that fail it
        (``CheckpointCorrupt``) are skipped with a warning naming each and why, and moved to
        ``refused/``: the run writes those steps again. With no good one left but one that was
        finished, ``CheckpointError`` says so in one line and how to start fresh: that is the
        user's call, not the trainer's."""
        refused: list[tuple[int, str]] = []
        unfinished = True  # every one refused is a save that did not finish: no checkpoint at all
        for step in reversed(self._numbered()):
            try:
                state, ledger = self.restore(step, abstract_state)
            except CheckpointCorrupt as error:
                reason = str(error).split(": ", 1)[-1]
                log.warning("checkpoint %s/%d is skipped: %s", self.directory, step, reason)
                refused.append((step, reason))
                unfinished = unfinished and isinstance(error, CheckpointUnsealed)
                continue
            if refused:
                self._set_aside([s for s, _ in refused])
                log.warning("resuming from checkpoint %d, the newest good one; set aside in %s/%s: %s", step,
                            self.directory, REFUSED, ", ".join(str(s) for s, _ in refused))
            return step, state, ledger
        if not refused:
            return None
        if unfinished:  # the first save was cut short: start afresh, and write those steps again
            self._set_aside([s for s, _ in refused])
            log.warning("no finished checkpoint in %s: starting afresh; set aside in %s/%s: %s", self.directory,
                        self.directory, REFUSED, ", ".join(str(s) for s, _ in refused))
            return None
        told = "; ".join(f"{step}: {reason}" for step, reason in refused)
        raise CheckpointError(f"no good checkpoint in {self.directory} ({told}); to start fresh, move that folder "
                              "away or give the run another run.output_dir")

    def _set_aside(self, steps: list[int]) -> None:
        if self._is_chief:
            taken = set(self._storage.list(REFUSED))
            for step in steps:
                name, n = str(step), 1
                while name in taken:
                    name, n = f"{step}-{n}", n + 1
                self._storage.move(str(step), f"{REFUSED}/{name}")
                taken.add(name)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices("rlax checkpoints set aside")
        self._manager.reload()

    def wait(self) -> None:
        """Block until background saves are on disk and sealed; raise what went wrong with them."""
        self._manager.wait_until_finished()
        pending, self._sealing = self._sealing, []
        for future in pending:
            future.result()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._sealer.shutdown()
            self._manager.close()


def _as_saved(abstract_state: Any, seal: Seal, where: str) -> Any:
    """``abstract_state`` with the dtypes the checkpoint was saved in (verified before any cast)."""
    saved = seal.arrays
    wanted = named_leaves(abstract_state)
    missing = [name for name, _ in wanted if name not in saved]
    extra = sorted(set(saved) - {name for name, _ in wanted})
    if missing or extra:
        raise CheckpointError(f"{where} holds another state than this trainer's (not in it: {missing[:3]}; "
                              f"only in it: {extra[:3]}): was it written with another model or trainer config?")
    for name, leaf in wanted:
        if list(leaf.shape) != saved[name]["shape"]:
            raise CheckpointError(f"{where}: {name} has shape {tuple(saved[name]['shape'])}, this trainer's "
                                  f"{tuple(leaf.shape)}: was it written with another model or trainer config?")
    return jax.tree.map(lambda leaf, name: jax.ShapeDtypeStruct(leaf.shape, saved[name]["dtype"], sharding=leaf.sharding),
                        abstract_state, jax.tree_util.tree_unflatten(jax.tree.structure(abstract_state),
                                                                     [name for name, _ in wanted]))


def _first_line(error: BaseException) -> str:
    """The first line of the innermost cause: orbax wraps tensorstore's precise error (``Error reading
    "w/0.0" ...: ZSTD_decompressStream() failed: Data corruption detected``) in one that dumps a spec."""
    seen = set()
    while id(error) not in seen and (error.__cause__ or error.__context__) is not None:
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def abstract_like(tree: Any) -> Any:
    """ShapeDtypeStructs (with shardings) of a tree of arrays: the restore target."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
