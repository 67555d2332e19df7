"""Start-up stamps: when each process of the online loop reached each hop of its start-up.

A stamp is a wall-clock time (``time.time()``) under ``startup/<hop>_t``, so stamps taken by the
launcher, the trainer and the rollout processes can be put on one timeline. A process marks its hops
with :func:`mark` (the first mark of a hop wins) and hands them on once:

* the trainer: in its first metrics row (``OUTPUT/metrics/metrics.jsonl``, :func:`take`);
* rollout processes (the stream's driver, each SDK worker): ``ROOT/RUN-metrics/startup/ROLE-HOST-PID.json``
  (:func:`write_stamps`), which ``rlax launch`` joins (:func:`read_stamps`) into the loop's metrics
  row of step 0 together with its own.

:func:`startup_timeline` turns the joined stamps into the hops' seconds since the launch started.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Mapping

from rlax_core.utils.paths import rollout_metrics_dir

log = logging.getLogger(__name__)

PREFIX = "startup/"

# The hops in the order a loop goes through them, per process (see docs/loop.md, "Start-up").
HOPS = (
    "launch",                   # rlax launch called (before it reads the config and checks the inputs)
    "launch_spawned",           # ... the trainer and rollout processes spawned
    "trainer_process",          # the trainer's interpreter started
    "trainer_imports",          # its configuration read and JAX imported
    "trainer_model",            # the initial policy loaded
    "trainer_publish",          # weight version 0 handed to the publisher
    "trainer_compiled",         # the GRPO step compiled (ahead of the first rollouts, or in the first step)
    "rollout_process",          # the rollout job's interpreter started
    "rollout_imports",          # its configuration read, Beam and the training set loaded
    "prism_up",                 # the local Prism job server answers
    "job_submitted",            # the streaming pipeline submitted
    "worker_start",             # an SDK worker starts building its engine
    "worker_model",             # ... base model and tokenizer loaded
    "engine_compiled",          # ... engine built and its programs compiled
    "worker_first_weights",     # ... the first weight version (0 in a new run) loaded into the engine
    "worker_first_generated",   # ... first engine call done
    "trainer_first_read",       # the trainer has its first step's rollout groups
)

_stamps: dict[str, float] = {}
_handed_on: set[str] = set()  # keys :func:`take` has returned
_lock = threading.Lock()


def key(hop: str) -> str:
    return f"{PREFIX}{hop}_t"


# A rollout worker's start-up, in order, as the stream's driver reports it: before the first hop no
# worker process is up yet (Dataflow provisions VMs and pulls the worker image).
WORKER_PHASES = (
    ("worker_start", "image up: the worker process is loading the model"),
    ("worker_model", "weights loaded: the engine is compiling"),
    ("engine_compiled", "engine compiled"),
)
NO_WORKER_YET = "no worker process up yet (VMs provisioning, the worker image pulling)"

_reporting: tuple[str, str, str] | None = None  # (rollout_root, run, role) each new stamp is written to


def report_to(rollout_root: str, run: str, role: str) -> None:
    """From now on every new stamp of this process is written at once (``write_stamps``), so the
    stream's driver sees a worker's start-up phase by phase, not only once it is over."""
    global _reporting
    _reporting = (rollout_root, run, role)


def mark(hop: str, at: float | None = None) -> None:
    """Stamp ``hop`` now (or at ``at``); a hop already stamped in this process keeps its first time."""
    with _lock:
        new = key(hop) not in _stamps
        _stamps.setdefault(key(hop), time.time() if at is None else at)
    if new and _reporting is not None:
        write_stamps(*_reporting)


def stamps() -> dict[str, float]:
    with _lock:
        return dict(_stamps)


def take() -> dict[str, float]:
    """The stamps not handed on yet, once: a second call returns only what was marked since."""
    with _lock:
        taken = {k: v for k, v in _stamps.items() if k not in _handed_on}
        _handed_on.update(taken)
        return taken


def process_started_at() -> float | None:
    """When this process's interpreter started (wall clock), from ``/proc``; None where there is none."""
    try:
        with open("/proc/self/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as handle:
            uptime = float(handle.read().split()[0])
        started_after_boot = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22: starttime
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - (uptime - started_after_boot)


def mark_process_start(role: str) -> None:
    """Stamp ``ROLE_process`` at this interpreter's start (where ``/proc`` tells it)."""
    started = process_started_at()
    if started is not None:
        mark(f"{role}_process", started)


def _folder(rollout_root: str, run: str) -> str:
    return rollout_metrics_dir(rollout_root, run, "startup")


def write_stamps(rollout_root: str, run: str, role: str) -> None:
    """This process's stamps so far to ``ROOT/RUN-metrics/startup/ROLE-HOST-PID.json`` (rewritten whole).
    A store that refuses the file costs the timeline its stamps, never the process its work."""
    import fsspec

    try:
        fs, folder = fsspec.core.url_to_fs(_folder(rollout_root, run))
        fs.makedirs(folder, exist_ok=True)
        name = f"{role}-{socket.gethostname()}-{os.getpid()}.json"
        fs.pipe_file(f"{folder}/{name}", json.dumps(stamps(), sort_keys=True).encode())
    except OSError as error:
        log.warning("start-up stamps not written to %s: %s", rollout_root, error)


def worker_phases(rollout_root: str, run: str) -> list[tuple[int, float]]:
    """Per rollout worker process that reported: (how many of :data:`WORKER_PHASES` it has passed,
    when it passed the last), from its stamps file."""
    import fsspec

    fs, folder = fsspec.core.url_to_fs(_folder(rollout_root, run))
    try:
        fs.invalidate_cache(folder)
        files = sorted(fs.glob(f"{folder}/worker-*.json"))
    except FileNotFoundError:
        return []
    phases = []
    for path in files:
        try:
            found = json.loads(fs.cat_file(path))
        except (OSError, ValueError):
            continue  # being rewritten: read again at the next poll
        passed = [found[key(hop)] for hop, _ in WORKER_PHASES if key(hop) in found]
        phases.append((len(passed), max(passed, default=0.0)))
    return phases


def read_stamps(rollout_root: str, run: str) -> dict[str, float]:
    """Every rollout process's stamps, joined: per hop the earliest (the first worker up sets the pace)."""
    import fsspec

    fs, folder = fsspec.core.url_to_fs(_folder(rollout_root, run))
    try:
        files = sorted(fs.glob(f"{folder}/*.json"))
    except FileNotFoundError:
        return {}
    joined: dict[str, float] = {}
    for path in files:
        try:
            found = json.loads(fs.cat_file(path))
        except (OSError, ValueError):
            continue  # a file being rewritten: its stamps were advice, the loop's metrics go on without them
        for name, value in found.items():
            joined[name] = min(value, joined.get(name, value))
    return joined


def startup_timeline(row: Mapping[str, float]) -> dict[str, float]:
    """Seconds from ``startup/launch_t`` to each stamped hop of ``row``, in :data:`HOPS` order; empty
    without the launch's stamp."""
    launch = row.get(key("launch"))
    if launch is None:
        return {}
    return {hop: round(row[key(hop)] - launch, 3) for hop in HOPS if key(hop) in row}
