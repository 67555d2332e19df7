"""The rollout, without Beam: what the rollout fleet computes, whatever runs it.

    config.py      LoopConfig: the ``loop:`` section (samples per prompt, sampling, rewards, pacing)
    spec.py        RolloutSpec: the run's sections a worker needs, picklable (holds them, copies none)
    schedule.py    the prompt schedule (pure functions of run seed and step) and its work units
    curriculum.py  loop.curriculum: which rows a step draws (uniform, difficulty_pools, balanced, a user's)
    prompt_state.py  per-prompt state folded from scored groups of steps <= s - k - 1
    drawing.py     StepDraws: a process's draws, saved states and curriculum metrics
    claims.py      claims on steps in flight, held in the run's store across processes and VMs
    scheduler.py   StepPacer: a tick's work units (pacing, the store, the claims)
    host.py        EngineHost: the one engine of a process, shared by its threads (rollouts and RunInference)
    worker.py      RolloutWorker: a host that follows the weight store and combines its threads' calls
    generation.py  work units -> rollout groups (rows through rlax_core.data.records), scoring
    metrics.py     a step's rollout-side metrics from its groups' summaries

``transforms.rollout`` wires these into the Beam streaming pipeline, one thin DoFn per stage.
"""

from rlax_core.utils.lazy_exports import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(__name__, {
    "config": ["LoopConfig"],
    "spec": ["RolloutSpec"],
})
