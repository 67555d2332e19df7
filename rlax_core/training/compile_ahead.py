"""Compiling a packed update ahead, while the trainer waits for rollouts.

A packed batch's shape is a bucket of its tokens (``packing.bucket``), known only when its groups land,
and the first batch of each bucket compiles the update: on the critical path of that step (tens of
seconds on a laptop CPU, minutes for a large model on a slice). The trainer's start-up wait for the
rollout fleet is idle, so the buckets of likely token counts compile then, one after another on one
background thread. A step whose batch has one of those shapes waits for that compile instead of
starting its own; a guess no batch meets costs one compile on an otherwise idle thread.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from typing import Any, Mapping, Sequence

import jax

log = logging.getLogger(__name__)


def batch_shape(batch: Mapping[str, Any]) -> tuple:
    """What tells two packed batches' compiled updates apart: the rows' and the sample slots' shapes."""
    return tuple(tuple(batch[name].shape) for name in ("tokens", "loss_mask"))


def abstract(tree: Any) -> Any:
    """Shapes, dtypes and shardings of ``tree``'s arrays: a compile ahead never reads (or holds) a
    buffer that the steps running meanwhile donate."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding,
                                                       weak_type=x.weak_type), tree)


class CompileAhead:
    """Compiles ``trainer``'s update for batches of ``rollouts`` samples of each of ``mean_tokens``
    tokens on average, in that order, on a background thread (``Trainer.lower_step``)."""

    def __init__(self, trainer, state, rollouts: int, ref_params: Any | None, mean_tokens: Sequence[int]):
        state, ref_params = abstract(state), None if ref_params is None else abstract(ref_params)
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile-ahead")
        self._pending: dict[tuple, concurrent.futures.Future] = {}
        self._met: set[tuple] = set()  # the shapes steps have run: a new one compiles in its step
        for tokens in mean_tokens:
            shape = batch_shape(trainer.batches.abstract(rollouts, tokens))
            if shape not in self._pending:
                self._pending[shape] = pool.submit(self._compile, trainer, state, rollouts, ref_params, tokens)
        pool.shutdown(wait=False)  # the thread ends with its last compile

    @staticmethod
    def _compile(trainer, state, rollouts: int, ref_params: Any | None, tokens: int) -> float:
        started = time.monotonic()
        trainer.lower_step(state, rollouts, ref_params, mean_tokens=tokens).compile()
        seconds = time.monotonic() - started
        log.info("compiled ahead: the update for %d samples of ~%d tokens (%.1f s)", rollouts, tokens, seconds)
        return seconds

    @property
    def shapes(self) -> list[tuple]:
        return list(self._pending)

    def wait_for(self, batch: Mapping[str, Any], timeout_s: float) -> bool:
        """Before a step on ``batch``: wait for its shape's compile if one is under way or done (True),
        so the step reuses it; a failed compile raises here as the step would. False: none was made."""
        shape = batch_shape(batch)
        future = self._pending.pop(shape, None)
        first_met = shape not in self._met
        self._met.add(shape)
        if future is None:
            if first_met:  # what a recipe's compile_ahead_tokens could add
                log.info("the update for packed rows and samples of shapes %s compiles in this step: no "
                         "compile-ahead guess made that shape", shape)
            return False
        try:
            future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            raise TimeoutError(f"compiling the update ahead took over {timeout_s:.0f} s") from None
        return True
