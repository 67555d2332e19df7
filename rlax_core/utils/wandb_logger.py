"""Weights & Biases beside TensorBoard: the trainer's per-step scalars, when ``trainer.wandb.enabled``.

    trainer:
      wandb: {enabled: true, project: my-project, mode: online}   # default mode: offline

``wandb`` is an optional extra (``pip install 'rlax-beam[wandb]'``). ``mode: offline`` (the default)
needs no network and no account: the run is written under the metrics folder
(``METRICS/wandb/offline-run-*``) and ``wandb sync`` uploads it later; ``online`` streams it. The
JSON lines and TensorBoard events are written either way (``rlax_core.utils.metrics``).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Literal, Mapping

from rlax_core.config import require
from rlax_core.utils.paths import is_remote


@dataclasses.dataclass(frozen=True)
class WandbConfig:
    enabled: bool = False
    project: str = "rlax"
    entity: str | None = None
    name: str | None = None  # the run's name in W&B; rlax train uses run.name when unset
    group: str | None = None
    tags: tuple[str, ...] = ()
    mode: Literal["offline", "online"] = "offline"
    dir: str | None = None  # a local folder for wandb's files; default METRICS/wandb (a local metrics folder)

    def __post_init__(self):
        require(bool(self.project), "project", "a W&B project name")
        require(self.dir is None or not is_remote(self.dir), "dir", "a local folder (wandb writes its files locally)")


class WandbLogger:
    """One W&B run: ``write(step, scalars)`` logs the numeric scalars at ``step``; ``close`` finishes it."""

    def __init__(self, config: WandbConfig, *, metrics_dir: str, run_config: Mapping[str, Any] | None = None):
        try:
            import wandb
        except ImportError as error:  # its own message too: an installed wandb can fail to import
            raise ImportError(f"trainer.wandb.enabled needs the wandb package: pip install 'rlax-beam[wandb]' "
                              f"(import wandb: {error})") from error
        directory = config.dir or (f"{metrics_dir.removeprefix('file://')}/wandb" if not is_remote(metrics_dir) else "wandb")
        os.makedirs(directory, exist_ok=True)
        self.run = wandb.init(project=config.project, entity=config.entity, name=config.name, group=config.group,
                              tags=list(config.tags) or None, mode=config.mode, dir=directory,
                              config=dict(run_config or {}), settings=wandb.Settings(silent=True))

    def write(self, step: int, scalars: Mapping[str, Any]) -> None:
        numbers = {k: v for k, v in scalars.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and v is not None}
        self.run.log(numbers, step=int(step))

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() returns before wandb's service process has written the run file out; teardown
        # waits for it, so the offline run is complete when the job exits (or a test reads it).
        wandb.teardown()
