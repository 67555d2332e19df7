"""``EngineHost``: the one engine a worker process holds, with its tokenizer, shared by its threads.

Both Beam paths build it once per process and share it between DoFn instances and harness threads:
the rollout stream through ``apache_beam.utils.shared.Shared`` (``rlax_core.rollout.worker`` adds
weight following and combined calls), the batch pipelines' ``RunInference`` through its model
handler (``transforms.inference``). The model loads and compiles once. Every use of the engine
goes through the host (``generate``, ``run_episodes``, ``load_weights``), each under the host's
lock: the engine is not re-entrant. The lock is re-entrant, so that a caller holding it for a
sequence of uses (the rollout worker: load the newest weights, then generate) calls the same methods.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Mapping, Sequence

from rlax_core.inference.config import EngineConfig, GenerationSpec, SamplingParams
from rlax_core.tasks.prompts import prompt_ids
from rlax_core.utils.devices import use_cpu_cores_as_devices
from rlax_core.utils.identity import process_identity

logger = logging.getLogger(__name__)


class EngineHost:
    """A (replicated) engine over one model, its tokenizer, and the lock its callers share.

    ``model``: anything ``rlax_core.policy.source.load_policy`` reads (a model folder, a
    weight-store version, a checkpoint); ``tokenizer``: its folder when not the model's;
    ``compile_modes``: sampling modes compiled now, while the worker starts, rather than in the
    first call, with ``compile_episodes`` the multi-turn continuation too; ``version``: the weight
    version the loaded parameters count as.
    """

    def __init__(self, engine: EngineConfig, model: str, *, dtype: str = "float32", tokenizer: str | None = None,
                 version: int = 0, compile_modes: Sequence[Any] = (), compile_episodes: bool = False):
        if not model:
            raise ValueError("EngineHost: the model is empty; name the checkpoint to sample")
        if engine.replicas != 1:
            use_cpu_cores_as_devices()  # on a CPU worker, a replica per core (if JAX has not started yet)
        from rlax_core.inference.replicas import ReplicatedEngine
        from rlax_core.models.tokenizer import load_tokenizer
        from rlax_core.policy.source import load_policy, tokenizer_path
        from rlax_core.utils import startup

        self.config = engine
        self.tokenizer = load_tokenizer(tokenizer or tokenizer_path(model))
        loaded = load_policy(model, dtype=dtype)
        self.model_config = loaded.config
        startup.mark("worker_model")
        self._engine = ReplicatedEngine(engine, loaded.config, loaded.params, version=version,
                                        detokenize=self.tokenizer.decode)
        if compile_modes:
            self._engine.warm_up(modes=tuple(compile_modes), episodes=compile_episodes)
        self.lock = threading.RLock()  # one use of the engine at a time per process
        self._prompt_ids: dict[str, tuple[int, ...]] = {}  # by example id, tokenized on first use
        self.name = process_identity()

    @property
    def capacity(self) -> int:
        """Sequences one engine call decodes together: slots per replica times replicas."""
        return self.config.num_slots * self._engine.replicas

    @property
    def version(self) -> int:
        """The weight version the engine generates with."""
        return self._engine.version

    def prompt_ids(self, example: Mapping[str, Any]) -> tuple[int, ...]:
        """The example's prompt in its task's format (``rlax_core.tasks.prompts``), tokenized once."""
        ids = self._prompt_ids.get(example["id"])
        if ids is None:
            ids = self._prompt_ids[example["id"]] = tuple(prompt_ids(example, self.tokenizer))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def generate(self, requests: Sequence[Any]) -> list:
        """The engine's completions of ``requests`` (request order, then sample index)."""
        with self.lock:
            return self._engine.generate(requests) if requests else []

    def run_episodes(self, env: Any, starts: Sequence[Any], sampling: SamplingParams) -> list:
        """Episodes of ``env`` (``rlax_core.envs.EnvConfig``) for ``starts``, each replica running its
        share (an episode stays on the replica that holds its pages); start order, then sample index."""
        from rlax_core.envs.runner import run_episodes

        def run(engine, share):
            episodes = iter(run_episodes(engine, self.tokenizer, env, share, sampling))
            return [[next(episodes) for _ in range(start.samples)] for start in share]

        with self.lock:
            per_start = self._engine.each_replica(list(starts), run) if starts else []
        return [episode for episodes in per_start for episode in episodes]

    def load_weights(self, follower: Any) -> int:
        """Hand the follower's newest verified version to the engine (``WeightFollower.hand_to``)."""
        with self.lock:
            return follower.hand_to(self._engine)

    def complete(self, examples: Sequence[Mapping[str, Any]], spec: GenerationSpec) -> list[dict[str, Any]]:
        """Every example with ``spec``'s samples: texts, token lengths and finish reasons (or why it was skipped)."""
        from rlax_core.inference.engine import Request

        sampling: SamplingParams = spec.params()
        results, requests = [], []
        for example in examples:
            ids = self.prompt_ids(example)
            result = {"example": dict(example), "model": spec.label, "texts": [], "lengths": [],
                      "finish_reasons": [], "skipped": None}
            if len(ids) > self.config.max_prompt_len:
                result["skipped"] = f"prompt of {len(ids)} tokens exceeds max_prompt_len={self.config.max_prompt_len}"
            else:
                requests.append(Request(list(ids), sampling, prompt_id=example["id"], seed=spec.seed))
            results.append(result)
        started = time.monotonic()
        completions = self.generate(requests)
        logger.info("%s: %d prompt(s) x %d sample(s), %d tokens in %.1f s", spec.label, len(requests),
                    sampling.samples_per_prompt, sum(len(c.completion_ids) for c in completions),
                    time.monotonic() - started)
        by_id = {r["example"]["id"]: r for r in results}
        for completion in completions:  # in request order, then sample index
            result = by_id[completion.prompt_id]
            result["texts"].append(self.decode(completion.completion_ids))
            result["lengths"].append(len(completion.completion_ids))
            result["finish_reasons"].append(completion.finish_reason)
        return results
