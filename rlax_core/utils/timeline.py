"""The online loop's step timeline: where the time between a weight publish and the trainer reading the
rollouts it allowed goes, hop by hop, joined from the two jobs' metrics on their wall clocks.

Both jobs stamp wall-clock times (``time.time()``, keys ending ``_t``; durations end ``_s``):

* the trainer, in its metrics row of step ``N`` (it trained schedule step ``N - 1`` and published
  weight version ``N``): ``timeline/wait_start_t``, ``timeline/read_t`` (all groups read),
  ``timeline/publish_t`` (version ``N`` handed to the publisher) and ``timeline/commit_version`` /
  ``timeline/commit_t`` (the version published before it, usually ``N - 1``, and when it was committed);
* the rollout stream, in the step metrics of schedule step ``s`` (``rlax_core.rollout.metrics``):
  ``timeline/scheduled_version`` (the version that let ``s`` be scheduled), ``timeline/version_seen_t``
  (first seen in the side input), ``timeline/scheduled_t``, ``timeline/generate_call_t`` (the worker
  took the engine), ``timeline/swap_s`` (weight load and swap in that call), ``timeline/generated_t``,
  ``timeline/scored_t``, ``timeline/written_t`` (last group file) and ``timeline/marked_t``.

``step_timeline`` turns them into the hops of each schedule step ``s`` generated with version ``v``:

=============  ==============================================================================
publish_s      trainer hands version ``v`` to the publisher -> ``v`` committed
side_input_s   committed -> the rollout stream's schedule first sees ``v`` (side-input refresh)
schedule_s     seen -> step ``s``'s work units emitted
dispatch_s     emitted -> a worker takes the engine for them (reshuffle, queueing)
swap_s         weight load + hot swap of the new version in the worker
generate_s     the engine call itself
reward_s       engine done -> the last group scored
write_s        scored -> the last group file written
read_s         written (or the trainer ready, if later) -> the trainer has every group of ``s``
=============  ==============================================================================

plus ``commit_to_read_s`` (committed -> read: the whole path a synchronous run waits through), the
trainer's ``train_s`` / ``wait_s`` of the step that consumed ``s``, and its ``after_train_s``: from the
end of that update to the start of the next wait (weight hand-over, checkpoint, metrics).
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Mapping

HOPS = ("publish_s", "side_input_s", "schedule_s", "dispatch_s", "swap_s", "generate_s", "reward_s", "write_s",
        "read_s")


def _diff(later: float | None, earlier: float | None) -> float | None:
    return None if later is None or earlier is None else later - earlier


def step_timeline(trainer_rows: Iterable[Mapping[str, Any]],
                  rollout_steps: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One dict per schedule step found in ``rollout_steps`` (``step``, ``version`` and every hop of
    ``HOPS`` that both sides' clocks allow, else None), ordered by step."""
    rows = {int(row["step"]): row for row in trainer_rows}
    commits = {int(row["timeline/commit_version"]): row["timeline/commit_t"]
               for row in rows.values() if row.get("timeline/commit_version") is not None}
    published = {step: row["timeline/publish_t"] for step, row in rows.items()
                 if row.get("timeline/publish_t") is not None}
    timeline = []
    for rollout in sorted(rollout_steps, key=lambda r: int(r["step"])):
        step = int(rollout["step"])
        if rollout.get("timeline/scheduled_version") is None:
            continue  # a step from before the timeline was recorded
        clock = {name: rollout.get(f"timeline/{name}") for name in (
            "version_seen_t", "scheduled_t", "generate_call_t", "swap_s", "generated_t", "scored_t", "written_t",
            "marked_t")}
        version = int(rollout["timeline/scheduled_version"])
        commit_t = commits.get(version)
        consumer = rows.get(step + 1, {})  # trainer row step+1 trained schedule step `step`
        read_t, wait_start_t = consumer.get("timeline/read_t"), consumer.get("timeline/wait_start_t")
        last_group_t = clock["written_t"] if clock["written_t"] is not None else clock["marked_t"]
        called = clock["generate_call_t"]
        swap = clock["swap_s"]
        timeline.append({
            "step": step,
            "version": version,
            "publish_s": _diff(commit_t, published.get(version)),
            "side_input_s": _diff(clock["version_seen_t"], commit_t),
            "schedule_s": _diff(clock["scheduled_t"], clock["version_seen_t"]),
            "dispatch_s": _diff(called, clock["scheduled_t"]),
            "swap_s": swap,
            "generate_s": _diff(_diff(clock["generated_t"], called), swap),
            "reward_s": _diff(clock["scored_t"], clock["generated_t"]),
            "write_s": _diff(clock["written_t"], clock["scored_t"]),
            "read_s": _diff(read_t, None if last_group_t is None or wait_start_t is None
                            else max(last_group_t, wait_start_t)),
            "commit_to_read_s": _diff(read_t, commit_t),
            "train_s": consumer.get("train/step_s"),
            "wait_s": consumer.get("train/wait_s"),
            "after_train_s": _diff(rows.get(step + 2, {}).get("timeline/wait_start_t"),
                                   None if read_t is None or consumer.get("train/step_s") is None
                                   else read_t + consumer["train/step_s"]),
        })
    return timeline


def median_hops(timeline: Iterable[Mapping[str, Any]]) -> dict[str, float | None]:
    """The median of each hop (and of ``commit_to_read_s``, ``train_s``, ``wait_s``, ``after_train_s``)
    over the steps that have it; None for a hop no step has."""
    steps = list(timeline)
    medians: dict[str, float | None] = {}
    for hop in (*HOPS, "commit_to_read_s", "train_s", "wait_s", "after_train_s"):
        values = [s[hop] for s in steps if s.get(hop) is not None]
        medians[hop] = statistics.median(values) if values else None
    return medians
