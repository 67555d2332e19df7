"""``RolloutSpec``: everything a rollout worker needs, picklable so that Beam ships it to every worker.

It holds the run's sections (``loop``, ``engine``, ``trainer``, ``algorithm``, the weight store) rather
than copies of their fields: a key read by the fleet has one name, from the YAML file to the engine.
"""

from __future__ import annotations

import dataclasses

from rlax_core.data.rollout_store import RolloutStore
from rlax_core.data.training_set import cached_examples
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.rewards.config import RewardConfig
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.rollout.claims import StepClaims, claim_lifetime_s
from rlax_core.rollout.config import LoopConfig
from rlax_core.training.config import TrainerConfig
from rlax_core.weights.config import WeightStoreConfig


@dataclasses.dataclass(frozen=True)
class RolloutSpec:
    run: str
    run_seed: int
    model_path: str  # base checkpoint: architecture and tokenizer (weights come from the store)
    # The engine's parameter dtype (model.dtype): the base checkpoint loads in it and every published
    # version is cast to it, whatever dtype the trainer publishes (weights.publish_dtype).
    model_dtype: str
    train_set_size: int  # rows the launcher saw in loop.train_set; a worker that reads another count stops
    rollout_root: str
    weights: WeightStoreConfig
    engine: EngineConfig
    loop: LoopConfig
    # What the trainer consumes: trainer.groups_per_step prompts per step, total_steps, max_staleness.
    trainer: TrainerConfig
    # What the stream does to a scored group: DAPO's overlong shaping and dynamic sampling (``groups``).
    algorithm: AlgorithmConfig
    # JAX's persistent compilation cache on the worker (rlax_core.utils.compile_cache): on or off, and
    # its folder ("" = the worker machine's default).
    compilation_cache: bool = True
    compilation_cache_dir: str = ""
    # This job's claims on steps (``claims.StepClaims``): a restarted stream does not wait out the
    # claims of the job it replaces. ``rlax rollout`` names each job; "" shares one set.
    job: str = ""

    def __post_init__(self):
        self.loop.named_rewards()  # a worker scores with the recipe's reward, never a default

    @property
    def rewards(self) -> RewardConfig:
        """What the rollouts are scored by: ``loop.rewards``, named (checked on construction)."""
        return self.loop.named_rewards()

    @property
    def prompts_per_step(self) -> int:
        """Prompts (so groups) per schedule step: one trainer step's batch."""
        return self.trainer.groups_per_step

    @property
    def total_steps(self) -> int:
        return self.trainer.total_steps

    @property
    def max_staleness(self) -> int:
        return self.trainer.max_staleness

    def sampling(self) -> SamplingParams:
        """Each request's sampling settings (``loop.sampling`` on the run's engine)."""
        return self.loop.sampling.params(self.engine)

    def claims(self) -> StepClaims:
        """This job's claims on steps, in the rollout store, live ``loop.expected_step_s`` twice over."""
        return StepClaims(self.rollout_root, claim_lifetime_s(self.loop.expected_step_s), self.job)

    def store(self) -> RolloutStore:
        return RolloutStore(self.rollout_root, self.run)

    def examples(self) -> tuple[dict, ...]:
        """The training set's rows (``loop.train_set``: parquet or .jsonl, local or gs://), read once per
        worker process, so that the job graph does not grow with the data."""
        rows = cached_examples(self.loop.train_set)
        if len(rows) != self.train_set_size:
            raise RuntimeError(f"training set {self.loop.train_set} holds {len(rows)} rows, the job was launched "
                               f"with {self.train_set_size}: the prompt schedule would change; relaunch the job")
        return rows
