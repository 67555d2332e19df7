"""The policy a run starts from: ``model.path`` as it is, or with ``model.upcycle`` a mixture of experts
made from it once, in the run folder.

    path = prepare_policy(run_config)   # launch, quickstart, train and rollout: before they load it

``RunConfig.policy_path()`` says where the policy is, ``pipelines.config.policy_shape`` what shape it
has before any folder is written (plan, fleet, compile); this module makes it exist. An upcycled policy
(``RUN/upcycled_model``, a ``MixtralForCausalLM`` folder: ``rlax_core.models.upcycle``) is written
once and then loaded like any checkpoint: its experts' noise and its router are drawn at random, so
the trainer, every rollout worker and a resumed run must all read the same file, not each make their
own. ``upcycle.json`` in it records what it was made from; a folder whose record differs from the
config (another seed, another number of experts) is refused rather than trained on.

A local folder is staged beside its place and renamed into it, so a reader never sees half of one,
and when two jobs started together both make it (``rlax train`` and ``rlax rollout`` started by hand)
the first rename wins and the second job reads that one. On gs:// every object lands whole and the
record is written last; two writers write the same bytes (the upcycle is seeded).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rlax_core.config import require

log = logging.getLogger(__name__)

RECORD = "upcycle.json"  # beside the upcycled weights: the source and settings they were made with


def upcycle_record(model) -> dict[str, Any]:
    """What an upcycled folder of ``model`` (a ``ModelSpec`` with ``upcycle``) must have been made from."""
    spec = model.upcycle
    return {"source": model.path, "num_experts": spec.num_experts, "experts_per_token": spec.experts_per_token,
            "noise": spec.noise, "seed": spec.seed}


def prepare_policy(run_config) -> str:
    """``run_config.policy_path()``, its upcycled mixture written first when the run has none yet."""
    path = run_config.policy_path()
    model = run_config.model
    if model.upcycle is None:
        return path
    from rlax_core.utils.paths import is_remote

    wanted = upcycle_record(model)
    made = read_record(path)
    # A local folder lands whole by its rename: one without a record is not this run's. On gs:// the
    # record is written last, so a folder without it is a write cut short, and is made again.
    if made is None and (is_remote(path) or not Path(path).exists()):
        log.info("upcycling %s into %d experts (%d per token) at %s", model.path, model.upcycle.num_experts,
                 model.upcycle.experts_per_token, path)
        write_upcycled(model, path, wanted)
        made = read_record(path)
    require(made is not None, "model.upcycle", f"{path} exists but holds no {RECORD}: this run did not make it; "
                                               "move it away or choose another run folder")
    require(made == wanted, "model.upcycle",
            f"{path} was upcycled from {_settings(made)}, and this config asks for {_settings(wanted)}; "
            "resume with the settings it was made with, or start a new run folder")
    return path


def read_record(path: str) -> dict[str, Any] | None:
    """The record of the upcycled folder at ``path``; None where there is none (yet)."""
    from rlax_core.utils.paths import is_remote
    from rlax_core.utils.storage import open_storage

    if not is_remote(path):  # LocalStorage would create the folder it is asked about
        record = Path(path) / RECORD
        return json.loads(record.read_text()) if record.is_file() else None
    storage = open_storage(path)
    return json.loads(storage.read(RECORD)) if storage.exists(RECORD) else None


def write_upcycled(model, path: str, record: dict[str, Any]) -> None:
    """Upcycle ``model`` into ``path`` with ``record`` beside it. Locally the folder lands whole by a
    rename (a job that loses the race keeps the one there); on gs:// the record is written last."""
    from rlax_core.models.upcycle import upcycle_folder
    from rlax_core.utils.paths import is_remote
    from rlax_core.utils.storage import open_storage

    spec = model.upcycle

    def make(destination: str) -> None:
        upcycle_folder(model.resolved_path(), destination, num_experts=spec.num_experts,
                       experts_per_token=spec.experts_per_token, noise=spec.noise, seed=spec.seed)
        open_storage(destination).write(RECORD, json.dumps(record, indent=2).encode())

    if is_remote(path):
        make(path)
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent)
    try:
        make(staging)
        os.rename(staging, target)
    except OSError:
        if not target.exists():  # not a lost race: a full disk, a permission
            raise
        log.info("%s was made by another job of this run meanwhile; using it", target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _settings(record: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in record.items())
