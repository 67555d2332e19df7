"""What one rollout worker process holds: its ``EngineHost``, its sampler (completions or episodes,
``samplers``), the weight version it follows, and how its harness threads share the engine.

``GenerateRollouts`` (``transforms.rollout``) acquires one ``RolloutWorker`` per process through
``apache_beam.utils.shared.Shared``: the model loads and compiles once, and every DoFn instance and
harness thread of the process generates with it. On an accelerator VM that one process owns the
chips (the recipes' ``no_use_multiple_sdk_containers``) and its threads' units are combined into
full engine calls; on a CPU worker each process holds its own engine.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Optional

from rlax_core.rollout.drawing import StepDraws
from rlax_core.rollout.host import EngineHost
from rlax_core.rollout.samplers import make_sampler
from rlax_core.rollout.spec import RolloutSpec
from rlax_core.utils import startup
from rlax_core.utils.compile_cache import enable_compilation_cache

logger = logging.getLogger(__name__)


class RolloutWorker:
    """What one worker process holds: engine, tokenizer and the version its weights are at.

    Its threads share the engine by combining: a thread that finds the engine busy leaves its units
    in ``_waiting``; whichever thread takes the engine next brings it to the newest version any of
    them asked for (fresher weights only lower staleness), generates every waiting unit that
    version is fresh enough for in one call, and hands each thread its own results.
    """

    def __init__(self, spec: RolloutSpec):
        # Each start-up phase reaches the stream's driver as it passes (image up, weights, compiled).
        startup.report_to(spec.rollout_root, spec.run, "worker")
        startup.mark("worker_start")
        enable_compilation_cache(spec.compilation_cache_dir, enabled=spec.compilation_cache)
        # The engine's modules load after EngineHost has made each CPU core a device (before JAX starts).
        from rlax_core.inference.sequences import sampling_mode
        from rlax_core.weights.follower import WeightFollower
        from rlax_core.weights.store import WeightStore

        self.sampler = make_sampler(spec)
        self.draws = StepDraws(spec)  # imports the loop's curriculum modules in this process
        self.host = EngineHost(spec.engine, spec.model_path, dtype=spec.model_dtype, version=-1,
                               compile_modes=(sampling_mode(self.sampler.sampling),),
                               compile_episodes=self.sampler.compiles_episodes)
        startup.mark("engine_compiled")
        self.store = WeightStore(spec.weights)
        # The engine's dtype, not the publisher's. The engine holds the base of a LoRA run's adapter
        # versions and applies each one itself (engine.lora_mode): the follower reads only the adapters.
        self.follower = WeightFollower(self.store, dtype=spec.model_dtype, merge_adapters=False)
        self.spec = spec
        startup.write_stamps(spec.rollout_root, spec.run, "worker")
        self._waiting: list[_Batch] = []
        self._waiting_lock = threading.Lock()
        self.engine_calls = 0  # generate calls made for this process's threads (combined units count once)

    @property
    def name(self) -> str:
        return self.host.name

    def requests(self, step: int, slots: list[tuple[int, dict]]) -> list:
        """The sampler's requests for some prompt slots of ``step``: ``slots`` pairs each with its example."""
        return self.sampler.requests(self.host, step, slots)

    def follow(self, version: int) -> tuple[int | None, int]:
        """Bring the engine to the newest version <= ``version`` that verifies (a refused one is skipped:
        the engine keeps, or falls back to, the newest good one); returns (engine's version or None,
        versions newly refused)."""
        refused_before = set(self.follower.refused)
        started = time.monotonic()
        if self.follower.refresh(up_to=version):
            loaded = self.host.load_weights(self.follower)
            logger.info("rollout worker: loaded weights version %d in %.2f s", loaded, time.monotonic() - started)
        # Versions newly refused; one forgotten in the refresh (repaired) is no refusal.
        return self.follower.version, len(set(self.follower.refused) - refused_before)

    def generate(self, units: list[tuple[list, int]], version: int) -> "_Batch":
        """Generate ``units`` (each: its requests, and the oldest weight version it may use) with the
        newest version <= ``version``; see ``_Batch`` for what comes back."""
        batch = _Batch(units, version)
        with self._waiting_lock:
            self._waiting.append(batch)
        with self.host.lock:
            if not batch.done:
                with self._waiting_lock:
                    combined, self._waiting = self._waiting, []
                self._run(combined, batch)
        if batch.error is not None:
            raise batch.error
        return batch

    def _run(self, combined: list["_Batch"], own: "_Batch") -> None:
        started, call_t = time.monotonic(), time.time()
        try:
            loaded, own.refused = self.follow(max(b.version for b in combined))
            swapped_t = time.time()
            usable = [(b, i) for b in combined for i, (_, oldest) in enumerate(b.units)
                      if loaded is not None and loaded >= oldest]
            requests = [r for b, i in usable for r in b.units[i][0]]
            if loaded is not None:
                startup.mark("worker_first_weights")
            completions = self.sampler.generate(self.host, requests)
            self.engine_calls += bool(requests)
            if self.engine_calls == 1 and requests:
                startup.mark("worker_first_generated")
                startup.write_stamps(self.spec.rollout_root, self.spec.run, "worker")
        except Exception as error:  # every waiting thread fails with the engine's reason
            for b in combined:
                b.error, b.done = error, True
            return
        seconds = time.monotonic() - started
        timeline = {"generate_call_t": call_t, "swap_s": swapped_t - call_t, "swap_version": loaded,
                    "generated_t": time.time()}
        position = 0
        for b in combined:
            b.loaded, b.results, b.timeline = loaded, [None] * len(b.units), timeline
        for b, i in usable:  # each unit is charged its share of the call, so per-step sums stay true
            size = sum(self.sampler.samples_of(r) for r in b.units[i][0])
            b.results[i] = completions[position:position + size]
            b.seconds += seconds * size / len(completions)
            position += size
        for b in combined:
            b.done = True


@dataclasses.dataclass
class _Batch:
    """One thread's units waiting for the shared engine, and what came back: per unit its completions
    (request order, then sample index) or None when the newest usable weights were too old for it."""

    units: list  # (requests, the oldest weight version the unit may be generated with)
    version: int  # the newest version the thread knows of
    done: bool = False
    results: list = dataclasses.field(default_factory=list)
    loaded: Optional[int] = None  # the version the engine generated with (None: no usable weights)
    refused: int = 0  # weight versions the follower refused while this thread held the engine
    seconds: float = 0.0  # this thread's share of the engine call
    timeline: dict = dataclasses.field(default_factory=dict)  # the engine call's wall clocks (time.time())
    error: Optional[BaseException] = None
