"""A discrete-event simulation of the online loop at fleet scale: W rollout workers, one trainer, k.

What it models (the rules of ``rlax_core.rollout`` and ``rlax_core.training.job``):

* Each schedule step holds ``groups_per_step`` prompt groups, cut into work units of
  ``groups_per_unit`` groups. With newest visible weight version ``v``, only units of steps
  ``v .. v + k`` may be generated (pacing); a free worker takes the oldest ones, its share of what
  may be generated over the free workers and at most ``groups_per_call`` groups (one engine call),
  and stamps them with ``v``.
* A call of ``n`` groups takes ``call_overhead_s + n * seconds_per_group`` on one worker, where
  ``seconds_per_group = tokens_per_group * seconds_per_token + group_overhead_s`` (scoring, writing).
  Workers do not slow each other down (the calibration says how far that holds on a shared host).
* Streaming engines (``decode_step_s`` given): work goes out as the stream hands it out, in units
  of ``groups_per_unit`` groups, not whole engine calls. A worker's engine holds up to
  ``sequences_per_worker`` running sequences (its slots, or what its KV pool holds) and admits a
  unit as soon as it has room for the unit's ``samples_per_group`` x groups; units go to the worker
  with the most room (the Reshuffle spreads them). Every running sequence gains one token per
  decode step, and a step takes ``decode_step_s(n)`` with ``n`` sequences running (the compiled
  step's cost as a function of them: ``compile.decode_step``), so a group of ``tokens_per_group /
  samples_per_group`` tokens a sample needs that many steps, however many share them; admitting a
  group stalls its engine ``group_overhead_s`` (its prefill). Continuous batching makes a worker's
  throughput a function of how many sequences it runs, which the stream, not a call size, decides.
* A scoring stage of its own (``scoring_servers`` > 0: a reward model on chips of its own, between
  rollout and trainer): a generated group joins its queue, the oldest first; each of its servers (a
  chip holding the model) scores one group at a time in ``scoring_s_per_group``, and the group is
  written when scored. The stage streams: it scores one group while the workers generate the next,
  so it adds its latency to a step's last group and bounds the step when it is the slowest stage.
  Without it (0) scoring is taken to overlap generation, as before.
* The trainer trains steps in order, each once all its groups are written, for ``trainer_step_s``;
  version ``t + 1`` becomes visible to the workers ``weight_sync_s`` after step ``t`` ends
  (publish, commit, load). Version 0 is visible at time 0.

:func:`simulate` returns the steady-state rollout throughput (groups per second over the measured
steps), the trainer's idle fraction, the workers' (and the scoring servers') busy fraction and the
staleness histogram of the groups trained (train step minus the version that generated them; pacing keeps it <= k).
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import Counter, deque
from typing import Callable


@dataclasses.dataclass(frozen=True)
class FleetParams:
    """One fleet and loop configuration; times in seconds."""

    workers: int
    max_staleness: int  # k
    groups_per_step: int
    seconds_per_token: float  # one worker's generation cost per completion token, at its batch
    tokens_per_group: float  # G samples x mean completion length
    trainer_step_s: float
    weight_sync_s: float
    groups_per_unit: int = 1
    groups_per_call: int = 1  # groups one engine call takes when that many are available
    group_overhead_s: float = 0.0  # per group besides generation (scoring, writing)
    call_overhead_s: float = 0.0
    steps: int = 60  # steps simulated
    warmup_steps: int = 10  # steps left out of the measurement (the pipeline filling up)
    # Streaming engines (module docstring): seconds of one decode step with n sequences running.
    decode_step_s: Callable[[int], float] | None = None
    samples_per_group: int = 1
    sequences_per_worker: int = 1
    # A scoring stage of its own (module docstring): its servers, and one server's seconds per group.
    scoring_servers: int = 0
    scoring_s_per_group: float = 0.0

    def __post_init__(self):
        checks = {
            "workers": self.workers >= 1, "max_staleness": self.max_staleness >= 0,
            "groups_per_step": self.groups_per_step >= 1, "seconds_per_token": self.seconds_per_token >= 0,
            "tokens_per_group": self.tokens_per_group >= 0, "trainer_step_s": self.trainer_step_s >= 0,
            "weight_sync_s": self.weight_sync_s >= 0, "groups_per_unit": self.groups_per_unit >= 1,
            "groups_per_call": self.groups_per_call >= 1, "group_overhead_s": self.group_overhead_s >= 0,
            "call_overhead_s": self.call_overhead_s >= 0, "warmup_steps": self.warmup_steps >= 0,
            "steps": self.steps > self.warmup_steps, "samples_per_group": self.samples_per_group >= 1,
            "sequences_per_worker": self.sequences_per_worker >= 1, "scoring_servers": self.scoring_servers >= 0,
            "scoring_s_per_group": self.scoring_s_per_group >= 0,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"FleetParams: out of range: {', '.join(bad)} ({self})")
        if self.decode_step_s is None and self.seconds_per_group + self.call_overhead_s <= 0:
            raise ValueError("FleetParams: a group must take some time to generate")

    @property
    def seconds_per_group(self) -> float:
        return self.tokens_per_group * self.seconds_per_token + self.group_overhead_s


@dataclasses.dataclass(frozen=True)
class FleetResult:
    groups_per_s: float  # rollout throughput over the measured steps
    trainer_idle_fraction: float  # of the measured time, the trainer waiting for rollouts
    worker_busy_fraction: float  # of the measured time x workers, generating
    staleness: dict[int, int]  # groups trained, by train step - generating version
    seconds_per_step: float
    scoring_busy_fraction: float = 0.0  # of the measured time x scoring servers, scoring (0: no such stage)


def analytic_one_worker_synchronous(params: FleetParams) -> float:
    """Groups per second of 1 worker with k = 0: generate the step, train it, sync, repeat."""
    calls = -(-params.groups_per_step // min(params.groups_per_call, params.groups_per_step))
    generate = params.groups_per_step * params.seconds_per_group + calls * params.call_overhead_s
    return params.groups_per_step / (generate + params.trainer_step_s + params.weight_sync_s)


def simulate(params: FleetParams) -> FleetResult:
    p = params
    units = [(step, size) for step in range(p.steps)
             for size in _unit_sizes(p.groups_per_step, p.groups_per_unit)]
    queue: deque[tuple[int, int]] = deque(units)  # not yet taken, oldest step first
    untaken = Counter()  # groups per step not taken yet
    for step, size in units:
        untaken[step] += size
    written = Counter()  # groups written per step
    stamps: dict[int, list[int]] = {}  # per step: the version of each written group
    events: list[tuple[float, int, str, object]] = []  # (time, sequence, kind, payload)
    sequence = 0

    def push(time: float, kind: str, payload: object = None) -> None:
        nonlocal sequence
        heapq.heappush(events, (time, sequence, kind, payload))
        sequence += 1

    visible = 0
    idle_workers = list(range(p.workers))
    trainer_step, trainer_busy = 0, False
    trainer_waiting_since: float | None = 0.0  # the trainer waits for step 0's groups from the start
    idle_time = 0.0
    step_end: dict[int, float] = {}
    staleness = Counter()
    measured_busy = 0.0

    engines = [_Engine() for _ in range(p.workers)] if p.decode_step_s is not None else []
    to_score: deque[tuple[int, int]] = deque()  # generated groups (step, version) the scoring stage has not begun
    idle_scorers = p.scoring_servers
    scoring_busy = 0.0

    def generated(step: int, version: int, now: float) -> None:
        """A group's generation ended: written now, or queued for the scoring stage."""
        if not p.scoring_servers:
            return write(step, version)
        to_score.append((step, version))
        score(now)

    def write(step: int, version: int) -> None:
        written[step] += 1
        stamps.setdefault(step, []).append(version)

    def score(now: float) -> None:
        nonlocal idle_scorers
        while idle_scorers and to_score:
            idle_scorers -= 1
            push(now + p.scoring_s_per_group, "scored", (*to_score.popleft(), now))

    def stream(now: float) -> None:
        """Units to the engines with room, the most room first, while pacing allows them."""
        limit = visible + p.max_staleness
        while queue and queue[0][0] <= limit:
            step, size = queue[0]
            worker = max(range(p.workers), key=lambda w: p.sequences_per_worker - engines[w].running(p))
            engine = engines[worker]
            if engine.groups and engine.running(p) + size * p.samples_per_group > p.sequences_per_worker:
                return
            queue.popleft()
            untaken[step] -= size
            advance(worker, now)
            engine.groups += [[p.tokens_per_group / p.samples_per_group, step, visible] for _ in range(size)]
            engine.pause += size * p.group_overhead_s
            reschedule(worker, now)

    def advance(worker: int, now: float) -> None:
        nonlocal measured_busy
        engine = engines[worker]
        elapsed = now - engine.last
        if engine.groups:
            measured_busy += _clip(engine.last, now, step_end, p)
            paused = min(elapsed, engine.pause)
            engine.pause -= paused
            steps = (elapsed - paused) / p.decode_step_s(engine.running(p))
            for group in engine.groups:
                group[0] -= steps
        engine.last = now

    def reschedule(worker: int, now: float) -> None:
        engine = engines[worker]
        engine.epoch += 1
        if engine.groups:
            left = min(group[0] for group in engine.groups)
            push(now + engine.pause + max(0.0, left) * p.decode_step_s(engine.running(p)), "engine", (worker, engine.epoch))

    def dispatch(now: float) -> None:
        if engines:
            return stream(now)
        limit = visible + p.max_staleness
        while idle_workers and queue and queue[0][0] <= limit:
            # The fleet spreads what may be generated over its free workers: each takes its share, up
            # to what one engine call holds.
            allowed = sum(untaken[s] for s in range(queue[0][0], min(limit, p.steps - 1) + 1))
            share = min(p.groups_per_call, -(-allowed // len(idle_workers)))
            worker = idle_workers.pop()
            taken, groups = [], 0
            while queue and queue[0][0] <= limit and (not taken or groups + queue[0][1] <= share):
                step, size = queue.popleft()
                untaken[step] -= size
                taken.append((step, size))
                groups += size
            seconds = p.call_overhead_s + groups * p.seconds_per_group
            push(now + seconds, "call_done", (worker, taken, visible, now))

    def maybe_train(now: float) -> None:
        nonlocal trainer_busy, trainer_waiting_since, idle_time
        if trainer_busy or trainer_step >= p.steps or written[trainer_step] < p.groups_per_step:
            return
        if trainer_waiting_since is not None:
            idle_time += _clip(trainer_waiting_since, now, step_end, p)
            trainer_waiting_since = None
        trainer_busy = True
        push(now + p.trainer_step_s, "trained", trainer_step)

    dispatch(0.0)
    now = 0.0
    while events:
        now, _, kind, payload = heapq.heappop(events)
        if kind == "call_done":
            worker, taken, version, started = payload
            for step, size in taken:
                for _ in range(size):
                    generated(step, version, now)
            measured_busy += _clip(started, now, step_end, p)
            idle_workers.append(worker)
            maybe_train(now)
            dispatch(now)
        elif kind == "engine":
            worker, epoch = payload
            engine = engines[worker]
            if epoch != engine.epoch:
                continue
            advance(worker, now)
            done = [g for g in engine.groups if g[0] <= _DONE * p.tokens_per_group]
            engine.groups = [g for g in engine.groups if g[0] > _DONE * p.tokens_per_group]
            for _, step, version in done:
                generated(step, version, now)
            reschedule(worker, now)
            maybe_train(now)
            dispatch(now)
        elif kind == "scored":
            step, version, started = payload
            scoring_busy += _clip(started, now, step_end, p)
            write(step, version)
            idle_scorers += 1
            score(now)
            maybe_train(now)
        elif kind == "trained":
            step = payload
            lags = [step - v for v in stamps.pop(step)]
            if step >= p.warmup_steps:
                staleness.update(lags)
            step_end[step] = now
            trainer_busy = False
            trainer_step = step + 1
            trainer_waiting_since = now
            push(now + p.weight_sync_s, "visible", step + 1)
            maybe_train(now)
        elif kind == "visible":
            visible = max(visible, payload)
            dispatch(now)
    if trainer_step < p.steps:
        raise RuntimeError(f"fleet simulation stalled at step {trainer_step} of {p.steps}")
    start, end = _window(step_end, p)
    span = end - start
    measured_steps = p.steps - p.warmup_steps
    return FleetResult(
        groups_per_s=measured_steps * p.groups_per_step / span,
        trainer_idle_fraction=idle_time / span,
        worker_busy_fraction=measured_busy / (span * p.workers),
        staleness=dict(sorted(staleness.items())),
        seconds_per_step=span / measured_steps,
        scoring_busy_fraction=scoring_busy / (span * p.scoring_servers) if p.scoring_servers else 0.0,
    )


_DONE = 1e-9  # a group with fewer tokens left than this fraction of its own is done (float steps)


@dataclasses.dataclass
class _Engine:
    """One streaming worker: its groups [tokens a sample still needs, step, version], the stall its
    admitted prefills still owe, when it was last advanced, and its event's epoch (older ones are stale)."""

    groups: list = dataclasses.field(default_factory=list)
    pause: float = 0.0
    last: float = 0.0
    epoch: int = 0

    def running(self, p: FleetParams) -> int:
        return len(self.groups) * p.samples_per_group


def _unit_sizes(groups_per_step: int, groups_per_unit: int) -> list[int]:
    full, rest = divmod(groups_per_step, groups_per_unit)
    return [groups_per_unit] * full + ([rest] if rest else [])


def _window(step_end: dict[int, float], p: FleetParams) -> tuple[float, float]:
    start = step_end[p.warmup_steps - 1] if p.warmup_steps else 0.0
    return start, step_end.get(p.steps - 1, float("inf"))


def _clip(begin: float, end: float, step_end: dict[int, float], p: FleetParams) -> float:
    """The part of [begin, end] inside the measured window (its end not known yet: open)."""
    if p.warmup_steps and p.warmup_steps - 1 not in step_end:
        return 0.0
    start, stop = _window(step_end, p)
    return max(0.0, min(end, stop) - max(begin, start))
