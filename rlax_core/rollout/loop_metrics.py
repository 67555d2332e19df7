"""The online loop's per-step metrics: the trainer's rows joined with the rollout side's, by step.

    rows = loop_metrics(run_config.metrics_dir(), RolloutStore(run_config.rollout_root(), run))
    write_loop_metrics(rows, run_config.loop_metrics_dir())        # metrics.jsonl + TensorBoard

Per step: the trainer's metrics (``trainer/...``), the rollout side's (``rollout/...``, written by the
stream beside the store: ``rollout.metrics``), the staleness histogram of the step's rollouts
(``staleness/LAG``: how many versions behind the step each rollout was), the trainer's idle fraction
and the step's wall time (``loop/...``). ``rlax launch`` and the quickstart's report write them.
"""

from __future__ import annotations

import collections
from typing import Any

import fsspec

from rlax_core.data.rollout_store import RolloutStore
from rlax_core.utils import startup
from rlax_core.utils.metrics import MetricsWriter, read_metrics
from rlax_core.utils.paths import join


def loop_metrics(trainer_metrics_dir: str, store: RolloutStore,
                 launch_stamps: dict[str, float] | None = None) -> list[dict[str, Any]]:
    """The loop's per-step metrics: the trainer's rows (``trainer_metrics_dir``) joined with the rollout
    side's (``store``), by step. Step 0's row also holds every process's start-up stamps
    (``startup/...``, ``rlax_core.utils.startup``) and the launcher's own (``launch_stamps``: hop ->
    wall-clock time)."""
    # The trainer logs optimizer step t + 1 after training on schedule step t's groups.
    trainer_rows = {row["step"] - 1: row for row in read_metrics(trainer_metrics_dir)}
    rollout_rows = {row["step"]: row for row in store.read_step_metrics()}
    versions_by_step: dict[int, list[int]] = collections.defaultdict(list)
    for key in store.list_groups():
        versions_by_step[key.step].extend(store.read_group(key).column("policy_version").to_pylist())
    rows = []
    previous_time = None
    for step in sorted(set(trainer_rows) | set(rollout_rows)):
        row: dict[str, Any] = {"step": step}
        trained = trainer_rows.get(step, {})
        row.update({f"trainer/{k}": v for k, v in trained.items()
                    if k not in ("step", "time") and not k.startswith(startup.PREFIX)})
        row.update({f"rollout/{k}": v for k, v in rollout_rows.get(step, {}).items() if k != "step"})
        staleness = collections.Counter(step - v for v in versions_by_step.get(step, []))
        for lag, count in sorted(staleness.items()):
            row[f"staleness/{lag}"] = count
        if "train/wait_s" in trained and "train/step_s" in trained:
            busy_and_idle = trained["train/wait_s"] + trained["train/step_s"]
            row["loop/trainer_idle_fraction"] = trained["train/wait_s"] / busy_and_idle if busy_and_idle > 0 else 0.0
        if "time" in trained:
            if previous_time is not None:
                row["loop/step_wall_s"] = trained["time"] - previous_time
            previous_time = trained["time"]
        rows.append(row)
    stamps = {k: v for row in trainer_rows.values() for k, v in row.items() if k.startswith(startup.PREFIX)}
    stamps.update(startup.read_stamps(store.root, store.run))
    stamps.update({startup.key(hop): at for hop, at in (launch_stamps or {}).items()})
    if stamps:
        if not rows or rows[0]["step"] != 0:
            rows.insert(0, {"step": 0})
        rows[0].update(stamps)
    return rows


def write_loop_metrics(rows: list[dict[str, Any]], directory: str) -> None:
    """``DIR/metrics.jsonl`` + TensorBoard, written afresh (a local folder or a URL)."""
    fs, path = fsspec.core.url_to_fs(join(directory, "metrics.jsonl"))
    try:
        fs.rm(path)
    except FileNotFoundError:
        pass
    with MetricsWriter(directory) as writer:
        for row in rows:
            writer.write(row["step"], {k: v for k, v in row.items() if k != "step"})
