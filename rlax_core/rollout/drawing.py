"""``StepDraws``: a process's view of the curriculum: the rows step ``s`` draws and the step's metrics.

    draws = StepDraws(spec)              # the loop's curriculum (its user modules imported here)
    rows = draws.rows(step)              # training-set rows of step's prompt slots
    metrics = draws.metrics(step)        # curriculum/... for the step's metrics row

The state step ``s`` reads is ``prompt_state``'s fold of the scored groups of steps ``<= s - k - 1``.
Folding is incremental in a process, and the state after each folded step is saved beside the store
(``ROOT/RUN-metrics/curriculum/state_step_N.json``, the state before step N): a replacement rollout
job, or a run continued with ``--resume``, starts from the newest saved state instead of reading every
group again. Saving is idempotent (the content is a function of committed groups only), so any
process may write it. The ``uniform`` curriculum without retire or rest settings reads no state at all:
it is today's schedule, at today's cost.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import fsspec

from rlax_core.rollout.curriculum import Curriculum, make_curriculum
from rlax_core.rollout.prompt_state import CurriculumState, PromptTable, read_table, step_scores
from rlax_core.rollout.spec import RolloutSpec
from rlax_core.utils.paths import is_remote, rollout_metrics_dir


def state_path(spec: RolloutSpec, next_step: int) -> str:
    return rollout_metrics_dir(spec.rollout_root, spec.run, "curriculum", f"state_step_{next_step:08d}.json")


class StepDraws:
    def __init__(self, spec: RolloutSpec, examples: tuple[dict, ...] | None = None, *, wait_s: float | None = None):
        self.spec = spec
        self.curriculum: Curriculum = make_curriculum(spec.loop.curriculum)
        self._examples = examples
        # A step <= s - k - 1 not yet complete when s is drawn means pacing was bypassed (a test, a
        # hand-made unit): wait for it, as the trainer would, rather than draw from a partial state.
        self._wait_s = spec.loop.expected_step_s if wait_s is None else wait_s
        self._state: CurriculumState | None = None
        self._lock = threading.Lock()  # the worker's threads share one state
        self._rows: dict[int, list[int]] = {}

    @property
    def examples(self) -> tuple[dict, ...]:
        if self._examples is None:
            self._examples = self.spec.examples()
        return self._examples

    def rows(self, step: int) -> list[int]:
        """The training-set rows of ``step``'s prompt slots (slot i: ``rows(step)[i]``)."""
        with self._lock:
            if step not in self._rows:
                table = self._table(step) if self.curriculum.reads_state else _NoState(len(self.examples))
                self._rows[step] = self.curriculum.draw(table, step, self.spec.run_seed, self.spec.prompts_per_step)
            return self._rows[step]

    def state_for(self, step: int) -> CurriculumState:
        """The state step ``step`` draws from: scored groups of steps ``<= step - k - 1``."""
        target = max(0, step - self.spec.max_staleness)
        if self._state is None or self._state.next_step > target:
            self._state = self._saved_state(target) or self._seeded()
        store = self.spec.store()
        while self._state.next_step < target:
            folding = self._state.next_step
            keys = self._wait_complete(store, folding)
            self._state.fold(folding, step_scores(store, folding, keys), self.spec.loop.curriculum.ema_weight)
            self._save(self._state)
        return self._state

    def metrics(self, step: int, dropped: int, groups: int) -> dict:
        """The step's ``curriculum/...`` metrics: pool sizes, the draw's mean pass rate (of drawn prompts
        with one), retired and resting counts, and the share of groups dynamic sampling dropped."""
        row = {"curriculum/dropped_group_share": dropped / groups if groups else 0.0}
        if not self.curriculum.reads_state:
            return {**row, "curriculum/pool/eligible": len(self.examples), "curriculum/retired": 0,
                    "curriculum/resting": 0}
        with self._lock:
            table = self._table(step)
        rates = [table.pass_rate[r] for r in self.rows(step) if table.pass_rate[r] == table.pass_rate[r]]
        return {**row, **{f"curriculum/pool/{k}": v for k, v in self.curriculum.pools(table).items()},
                "curriculum/retired": int(table.retired.sum()), "curriculum/resting": int(table.resting.sum()),
                "curriculum/draw_pass_rate": sum(rates) / len(rates) if rates else None}

    def _table(self, step: int) -> PromptTable:
        config = self.spec.loop.curriculum
        return PromptTable.of(self.state_for(step), self.examples, step, retire_after_solved=config.retire_after_solved,
                              rest_after_failed=config.rest_after_failed, rest_steps=config.rest_steps)

    def _seeded(self) -> CurriculumState:
        seed_from = self.spec.loop.curriculum.seed_from
        return CurriculumState.seeded(self.examples, read_table(seed_from) if seed_from else ())

    def _wait_complete(self, store, step: int):
        deadline = time.monotonic() + self._wait_s
        while True:
            keys = store.list_groups()
            if store.is_step_complete(step, self.spec.prompts_per_step, keys):
                return keys
            if time.monotonic() >= deadline:
                raise TimeoutError(f"curriculum: step {step} is not complete in {store} after {self._wait_s:.0f} s; "
                                   "its scores are needed to draw later steps")
            time.sleep(0.5)

    def _saved_state(self, target: int) -> CurriculumState | None:
        """The newest saved state at most ``target`` (None: none saved, or one of another training set)."""
        fs, folder = fsspec.core.url_to_fs(rollout_metrics_dir(self.spec.rollout_root, self.spec.run, "curriculum"))
        try:
            names = sorted(fs.glob(f"{folder}/state_step_????????.json"), reverse=True)
        except FileNotFoundError:
            return None
        ids = {e["id"] for e in self.examples}
        for name in names:
            if int(name.rsplit("_", 1)[1].split(".")[0]) <= target:
                state = CurriculumState.from_json(fs.cat_file(name).decode())
                return state if ids <= state.prompts.keys() else None
        return None

    def _save(self, state: CurriculumState) -> None:
        fs, path = fsspec.core.url_to_fs(state_path(self.spec, state.next_step))
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        if is_remote(self.spec.rollout_root):
            fs.pipe_file(path, state.to_json().encode())  # one object upload: atomic on GCS
            return
        temp = f"{path}.tmp-{uuid.uuid4().hex}"  # a reader in another process never sees half a file
        with open(temp, "w") as handle:
            handle.write(state.to_json())
        os.replace(temp, path)


class _NoState:
    """What ``uniform`` without exclusions is given: the number of prompts, nothing else."""

    def __init__(self, num_prompts: int):
        self.ids = range(num_prompts)
