"""Data-parallel generation within one host: one ``Engine`` per device (or per group of
``engine.tensor_parallel`` devices), all decoding at once.

    engine = ReplicatedEngine(EngineConfig(num_slots=32, replicas=0), model.config, model.params)  # every local device
    completions = engine.generate(requests)        # as Engine.generate: request order, then sample index
    engine.update_weights(new_params, version=1)   # every replica; each swaps as Engine does

Each replica holds its own weights and paged cache on its device and runs its own decode loop in
its own thread (a compiled call releases the GIL), so ``num_slots`` is per replica. A request goes
whole to one replica, so its samples still share one prefill; requests are dealt to the
replica with the fewest sample tokens so far, in request order, so the split is deterministic.

Which replica decodes a sample does not change its random draws (they are keyed by seed, prompt id
and sample index), only the batch it shares, exactly as with one engine and a different batch.

On a CPU host, ``rlax_core.utils.devices.use_cpu_cores_as_devices`` makes each core a device: the
small operations of a small model run on one thread each, so a second replica is what puts the
second core to work.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

import jax

from rlax_core.inference.config import EngineConfig
from rlax_core.inference.engine import Completion, Engine, Request
from rlax_core.inference.placement import held_weights
from rlax_core.inference.sampling import SamplingMode
from rlax_core.models.config import ModelConfig


class ReplicatedEngine:
    """``Engine``'s ``generate`` / ``update_weights`` / ``update_adapters`` / ``warm_up`` over one engine per
    device, and ``each_replica`` for work that drives one engine itself (multi-turn episodes).

    ``devices`` default to the first ``config.replicas * config.chips_per_replica`` local devices
    (all of them for 0); consecutive groups of ``chips_per_replica`` (tensor_parallel x
    expert_parallel) form one replica.
    """

    def __init__(self, config: EngineConfig, model_config: ModelConfig, params: Any, version: int = 0,
                 detokenize: Callable[[Sequence[int]], str] | None = None,
                 devices: Sequence[jax.Device] | None = None):
        groups = replica_devices(config.replicas, config.chips_per_replica, devices)
        self.config = config
        one = dataclasses.replace(config, replicas=1)
        params = held_weights(params, config.weight_dtype)  # quantized once, not once per replica
        if config.chips_per_replica == 1:
            self.engines = [Engine(one, model_config, params, version, detokenize, device=group[0]) for group in groups]
        else:
            self.engines = [Engine(one, model_config, params, version, detokenize, devices=group) for group in groups]
        self._threads = ThreadPoolExecutor(len(groups), thread_name_prefix="engine-replica")

    @property
    def replicas(self) -> int:
        return len(self.engines)

    @property
    def version(self) -> int:
        """The weight version new sequences start on (the oldest replica's, mid-swap)."""
        return min(engine.version for engine in self.engines)

    @property
    def stats(self) -> dict[str, int]:
        """Every replica's counters, summed."""
        return {name: sum(engine.stats[name] for engine in self.engines) for name in self.engines[0].stats}

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Complete every request ``samples_per_prompt`` times across the replicas; request order, then sample index."""
        shares = self._deal(requests)
        results = self._on_every_replica(lambda engine, share: engine.generate([requests[i] for i in share]), shares)
        by_request: list[list[Completion]] = [[] for _ in requests]
        for share, completions in zip(shares, results):
            position = 0
            for i in share:  # each replica returns its requests in order, n completions each
                by_request[i] = completions[position:position + requests[i].sampling.samples_per_prompt]
                position += requests[i].sampling.samples_per_prompt
        return [completion for completions in by_request for completion in completions]

    def each_replica(self, items: Sequence[Any], work: Callable[[Engine, list], list]) -> list:
        """``work(engine, share)`` on every replica at once, the items dealt round-robin; ``work``
        returns one result per item of its share, and the results come back in item order. For work
        that must stay on one replica from start to end (an episode keeps its pages there)."""
        shares = [list(range(i, len(items), len(self.engines))) for i in range(len(self.engines))]
        results = self._on_every_replica(lambda engine, share: work(engine, [items[i] for i in share]), shares)
        by_item = {i: result for share, share_results in zip(shares, results) for i, result in zip(share, share_results)}
        return [by_item[i] for i in range(len(items))]

    def update_weights(self, params: Any, version: int) -> None:
        params = held_weights(params, self.config.weight_dtype)  # quantized once, not once per replica
        for engine in self.engines:
            engine.update_weights(params, version)

    def update_adapters(self, adapters: Any, lora: Any, version: int, base: Any = None) -> None:
        for engine in self.engines:
            engine.update_adapters(adapters, lora, version, base)

    def warm_up(self, modes: Sequence[SamplingMode] = tuple(SamplingMode), *, episodes: bool = False) -> None:
        self._on_every_replica(lambda engine, _: engine.warm_up(modes, episodes=episodes), [None] * len(self.engines))

    def close(self) -> None:
        self._threads.shutdown(wait=True)

    def __enter__(self) -> "ReplicatedEngine":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _deal(self, requests: Sequence[Request]) -> list[list[int]]:
        """Request indices per replica: each to the replica with the least sample tokens so far."""
        shares: list[list[int]] = [[] for _ in self.engines]
        load = [0] * len(self.engines)
        for i, request in enumerate(requests):
            target = min(range(len(self.engines)), key=lambda r: load[r])
            shares[target].append(i)
            sampling = request.sampling
            load[target] += sampling.samples_per_prompt * (len(request.prompt_ids) + sampling.max_new_tokens)
        return shares

    def _on_every_replica(self, work, arguments: list) -> list:
        """``work(engine, argument)`` on every replica at once; the first failure is raised."""
        if len(self.engines) == 1:
            return [work(self.engines[0], arguments[0])]
        futures = [self._threads.submit(work, engine, argument) for engine, argument in zip(self.engines, arguments)]
        return [future.result() for future in futures]


def replica_devices(replicas: int, chips_per_replica: int = 1,
                    devices: Sequence[jax.Device] | None = None) -> list[list[jax.Device]]:
    """Device groups of ``chips_per_replica`` each: every one of ``devices`` when given, else
    ``replicas`` groups of the local devices (0: as many as fit); a clear error when there are too few."""
    where = "this process has" if devices is None else "were given"
    if devices is not None:
        replicas = 0 if len(devices) % chips_per_replica == 0 else len(devices)  # not a whole number: refused below
    devices = list(jax.local_devices() if devices is None else devices)
    count = replicas or len(devices) // chips_per_replica
    if count < 1 or count * chips_per_replica > len(devices):
        raise ValueError(f"engine.replicas={replicas} but {where} {len(devices)} device(s), and "
                         f"{chips_per_replica} device(s) per replica (engine.tensor_parallel x expert_parallel) need "
                         f"{max(count, 1) * chips_per_replica}; on a CPU "
                         "host call rlax_core.utils.devices.use_cpu_cores_as_devices() before JAX starts")
    return [devices[i * chips_per_replica:(i + 1) * chips_per_replica] for i in range(count)]
