"""The overrides that shrink the quickstart recipe to a launch of a few seconds a step, in one place.

The loop's end-to-end tests (chaos, launch failures and ownership, the loop's staleness, multi-turn,
the rollout job's lifecycle) run ``configs/quickstart.yaml`` at this size: prompts of at most 64
tokens in two prefill buckets, a few new tokens, 8 engine slots and a trainer row that holds them.
Each test names only what it is about (steps, staleness, the engine's budget); ``None`` leaves a key
to the recipe.
"""

from __future__ import annotations

from pathlib import Path


def tiny_launch_overrides(output_dir: str | Path | None = None, *, steps: int, prompts: int = 2,
                          samples: int = 2, max_staleness: int | None = None, max_new_tokens: int = 8,
                          max_seq_len: int | None = 80, micro_batches: int | None = 1,
                          checkpoint_every: int | None = None, wait_timeout_s: int | None = None,
                          max_runtime_s: int | None = None, stall_polls: int | None = None) -> list[str]:
    """``key=value`` overrides for ``rlax launch`` / ``train`` / ``rollout`` of the quickstart recipe.

    ``micro_batches=1`` because a step of a few rows would be padded to the recipe's 16 micro-batches
    per device shard.
    """
    optional = {"run.output_dir": output_dir, "trainer.max_staleness": max_staleness,
                "trainer.checkpoint_every": checkpoint_every, "trainer.wait_timeout_s": wait_timeout_s,
                "trainer.max_seq_len": max_seq_len, "trainer.micro_batches": micro_batches,
                "loop.max_runtime_s": max_runtime_s, "loop.stall_polls": stall_polls}
    return [f"trainer.total_steps={steps}", f"trainer.groups_per_step={prompts}",
            "engine.max_prompt_len=64", "engine.prefill_buckets=[32,64]", f"engine.max_new_tokens={max_new_tokens}",
            "engine.num_slots=8", f"loop.sampling.samples_per_prompt={samples}", "loop.sampling.stop_token_ids=[1,2,13]",
            *(f"{key}={value}" for key, value in optional.items() if value is not None)]
