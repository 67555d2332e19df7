"""The fleet simulator fed by the compiler: generation and update costs from ``rlax compile --json``.

    costs = read_compiled_costs(json.load(open("runs/compile-qwq32b.json")))
    prediction = predict(costs, shape)          # shape: the recipe's numbers (``FleetShape``)

Each cost is a roofline time, ``max(FLOPs / peak FLOP/s, bytes accessed / HBM bandwidth)`` of one
chip's compiled program (``rlax_core.compile.report``); the chips of one engine replica or of the
trainer slice run their programs in step, so a program's time per chip is the replica's time.

* Decode: XLA counts a loop body once, so the decode program's figure is one decode step of every
  slot. XLA does not see the KV pages the paged-attention kernel reads; a step's cost is a function
  of the running sequences and their context lengths (``compile.decode_step.DecodeStepCost``: XLA's
  bytes plus each running sequence's pages by dtype), evaluated with every running sequence at the
  recipe's mean running context, its prompt and E[L^2] / 2 E[L] of the response lengths
  (``loop.response_lengths``). How many sequences an engine may run is the pool's
  (``planning.memory.concurrent_sequences``): reserving whole budgets (``engine.admission:
  reserve``), ``num_pages`` over pages per budget; with pages on demand, over what a running
  sequence holds on average. The simulator streams work to the engines in units of groups and runs
  as many as the stream gives each (``fleet.simulate``), so a step is as fast as its running
  sequences make it. One step yields a token for each of them.
* Prefill: the samples of one prompt share one prefill (the engine copies the first sample's pages),
  so a group costs one row of the prefill program at the smallest compiled bucket holding its prompt
  (left out, and said so, when the report holds no prefill).
* Update: the trainer's step loops over PPO epochs, mini-batches and micro-batches, its layers
  are one scanned block (``trainer.scan_layers``), and on TPU XLA turns sharded matmuls into
  windowed-einsum loops: XLA counts each loop body once. A report that carries
  ``roofline_per_run_s`` (``compile.loops``: each loop weighed by its trip count in the compiled
  HLO) gives the whole step. An older report gives one trip of each loop; the step is then
  ``update_iterations x layer_loop_factor`` times it, where ``layer_loop_factor`` is the model's
  forward FLOPs per token over those of the same model with one layer (1 with unrolled layers),
  which misses the windowed einsums' trips.
* Weight sync: the published weights' bytes over the host network, written by the trainer's hosts
  together and read whole by each rollout host: ``bytes / (trainer_hosts x bandwidth) + bytes /
  bandwidth``.

* Scoring on a stage of its own (a ``reward_model`` term with ``placement: own_stage``): the reward
  model's compiled forward (``compile.reward_model``: ``batch_size`` rows of ``max_length`` tokens on
  one chip of ``hardware.reward_model``, the weights whole on it, as the term holds them; its
  loop-corrected roofline: the scanned layers at their trip count) over its rows is one scored
  sequence's seconds, every sequence taken at that padded length; a group of G
  samples costs G of them (the stage's batches full: its Reshuffle fills them from the stream). The
  term runs one model per worker process, on one chip: the stage's servers are its hosts.

What the compiler cannot know is assumed and named as such: the mean prompt and completion lengths,
the host network bandwidth. Scoring without a stage of its own (verifiers, a reward model beside the
engine) is assumed to overlap generation.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from rlax_core.compile.decode_step import DECODE_PROGRAM, DecodeStepCost, decode_step_bytes
from rlax_core.fleet.simulate import FleetParams, simulate
from rlax_core.planning.memory import concurrent_sequences

# The program names ``rlax_core.compile.programs`` gives: "prefill 8x1024" (decode: ``DECODE_PROGRAM``).
_PREFILL = re.compile(r"^prefill (\d+)x(\d+)$")
_SCORE = re.compile(r"^reward model forward (\d+)x(\d+)$")  # compile.reward_model.PROGRAM

# Bytes per second of one TPU VM's data-centre network: 2 x 100 Gbps NICs per host, as published for
# v5e hosts (https://cloud.google.com/tpu/docs/v5e, "Per-host NIC configuration"); assumed for the
# other hosts, whose published figures this module does not carry.
HOST_NETWORK_BYTES_PER_S = 2 * 100e9 / 8


@dataclasses.dataclass(frozen=True)
class CompiledCosts:
    """Roofline seconds of one replica's compiled programs, read from an ``rlax compile`` report."""

    rollout_chip: str
    trainer_chip: str | None  # None: no update step was read (the trainer's step is given instead)
    decode_step_s: float  # one decode step of every slot of one engine replica
    decode_slots: int
    prefill_s: dict[int, tuple[int, float]]  # prompt bucket -> (rows per call, seconds per call)
    update_micro_batch_s: float | None  # one trip of each loop of the trainer's update step (XLA's count)
    update_step_s: float | None = None  # the whole step, each loop at its trip count (None: an older report)
    decode: DecodeStepCost | None = None  # the step as a function of the running sequences
    scoring_sequence_s: float | None = None  # the reward model's forward on its own stage, per row
    scoring_program: str | None = None  # its program and chip, for the prediction's inputs

    def decode_step_at(self, sequences: int, mean_context: float) -> float:
        """Seconds of one decode step with ``sequences`` running at ``mean_context`` tokens each (the
        compiled roofline of every slot where no KV counting came with the report)."""
        return self.decode_step_s if self.decode is None else self.decode.seconds_at(sequences, mean_context)

    def prefill_for(self, prompt_tokens: int) -> tuple[int, int, float] | None:
        """(bucket, rows per call, seconds per call) of the smallest compiled bucket that holds the
        prompt (the largest if none does); None when no prefill was compiled."""
        buckets = sorted(self.prefill_s)
        if not buckets:
            return None
        bucket = next((b for b in buckets if b >= prompt_tokens), buckets[-1])
        return (bucket, *self.prefill_s[bucket])

    def prefill_per_group_s(self, prompt_tokens: int) -> float:
        """One row of the prefill: the samples of a group share one prefill. 0 when none was compiled
        (a prefill is a small part of a group next to its decode: ``predict`` says it was left out)."""
        found = self.prefill_for(prompt_tokens)
        return found[2] / found[1] if found else 0.0


def read_compiled_costs(report: dict[str, Any], role: str = "rollout", *, need_update: bool = True,
                        kv_bytes_per_page: float | None = None, page_size: int | None = None) -> CompiledCosts:
    """The rollout engine's decode and prefill and the trainer's update from ``rlax compile --json``;
    without ``need_update`` (the trainer's step is given) a report without the trainer will do. The
    decode's KV reads per page come from the report, else from ``kv_bytes_per_page`` and ``page_size``.

    Raises ``ValueError`` naming what is missing (a program not compiled, a role not in the report)."""
    programs = report.get("programs")
    if not isinstance(programs, list):
        raise ValueError("not an `rlax compile --json` report: no list of programs")
    compiled = [p for p in programs if p.get("compiled") and p.get("roofline_s") is not None]
    decode = [p for p in compiled if p["role"] == role and DECODE_PROGRAM.match(p["program"])]
    prefill = {}
    for p in compiled:
        match = _PREFILL.match(p["program"]) if p["role"] == role else None
        if match:
            prefill[int(match.group(2))] = (int(match.group(1)), float(p["roofline_s"]))
    update = [p for p in compiled if p["role"] == "trainer"]
    scoring = [p for p in compiled if p["role"] == "reward_model" and _SCORE.match(p["program"])]
    wanted = [("a compiled decode program of role " + role, decode)]
    if need_update:
        wanted.append(("the trainer's compiled update step", update))
    missing = [name for name, found in wanted if not found]
    if missing:
        raise ValueError(f"the compile report {report.get('config', '')!r} lacks {'; '.join(missing)} "
                         "(compile the recipe's rollout and trainer roles: rlax compile --roles rollout,trainer; "
                         "or give the trainer's seconds per step)")
    kv_page = decode[0].get("kv_bytes_per_page") or kv_bytes_per_page
    page = decode[0].get("page_size") or page_size
    slots = int(DECODE_PROGRAM.match(decode[0]["program"]).group(1))
    step = (DecodeStepCost(decode[0]["chip"], slots, float(decode[0]["flops"]), decode_step_bytes(decode[0]),
                           float(kv_page), int(page)) if kv_page and page else None)
    return CompiledCosts(
        decode=step, rollout_chip=decode[0]["chip"], trainer_chip=update[0]["chip"] if update else None,
        decode_step_s=float(decode[0]["roofline_s"]), decode_slots=slots,
        prefill_s=prefill, update_micro_batch_s=float(update[0]["roofline_s"]) if update else None,
        update_step_s=float(update[0]["roofline_per_run_s"]) if update and update[0].get("roofline_per_run_s")
        else None,
        scoring_sequence_s=float(scoring[0].get("roofline_per_run_s") or scoring[0]["roofline_s"])
        / int(_SCORE.match(scoring[0]["program"]).group(1)) if scoring else None,
        scoring_program=f"{scoring[0]['program']} on {scoring[0]['chip']}" if scoring else None)


@dataclasses.dataclass(frozen=True)
class FleetShape:
    """A recipe's numbers the simulator needs beside the compiled costs; ``*_tokens`` means are assumed."""

    rollout_workers: int  # engine replicas (one per rollout host)
    trainer_hosts: int
    groups_per_step: int
    samples_per_prompt: int  # G
    max_staleness: int  # k
    update_iterations: int  # ppo_epochs x mini_batches x micro_batches: the update's loop trips
    num_slots: int
    num_pages: int
    page_size: int
    max_new_tokens: int
    prompt_tokens: int  # mean prompt length (assumed)
    completion_tokens: int  # mean completion length (assumed)
    weight_bytes: int  # the published weights
    layer_loop_factor: float = 1.0  # the update's layers over the one XLA counts (module docstring)
    host_network_bytes_per_s: float = HOST_NETWORK_BYTES_PER_S
    admission: str = "reserve"  # engine.admission
    occupancy_tokens: float = 0.0  # on_demand: completion tokens a running sequence holds on average
    groups_per_unit: int = 1  # loop.groups_per_unit: the stream's unit of work
    chips_per_worker: int = 1  # a rollout host's chips (for tokens per chip)
    scoring_servers: int = 0  # a reward model's own scoring stage: its hosts, one scoring chip each (0: none)

    def __post_init__(self):
        positive = ("rollout_workers", "trainer_hosts", "groups_per_step", "samples_per_prompt",
                    "update_iterations", "num_slots", "num_pages", "page_size", "max_new_tokens", "prompt_tokens",
                    "weight_bytes", "host_network_bytes_per_s")
        bad = [name for name in positive if not getattr(self, name) > 0]
        if not self.layer_loop_factor >= 1:
            bad.append("layer_loop_factor (>= 1)")
        if self.max_staleness < 0:
            bad.append("max_staleness")
        if self.scoring_servers < 0:
            bad.append("scoring_servers")
        if not 0 < self.completion_tokens <= self.max_new_tokens:
            bad.append(f"completion_tokens (1 .. max_new_tokens={self.max_new_tokens})")
        if bad:
            raise ValueError(f"FleetShape: out of range: {', '.join(bad)}")

    @property
    def mean_context(self) -> float:
        """Tokens a running sequence attends to on average: its prompt and what it has written."""
        return self.prompt_tokens + (self.occupancy_tokens or self.completion_tokens / 2)

    @property
    def concurrent_sequences(self) -> int:
        """Sequences an engine decodes at once: its slots, or fewer when the KV pool cannot hold
        them (whole budgets under ``reserve``, what they hold on average under ``on_demand``)."""
        return concurrent_sequences(self.num_pages, self.page_size, self.num_slots, self.prompt_tokens,
                                    self.max_new_tokens, self.occupancy_tokens or self.max_new_tokens,
                                    self.admission)


def fleet_params(costs: CompiledCosts, shape: FleetShape, steps: int = 40,
                 trainer_step_s: float | None = None) -> FleetParams:
    """The simulator's inputs: per-token and per-group seconds of one replica, the trainer's step and
    the weight sync, all from ``costs`` and ``shape`` (the module docstring says how); a given
    ``trainer_step_s`` replaces the compiled one."""
    if trainer_step_s is None and costs.update_micro_batch_s is None:
        raise ValueError("no compiled update step was read: give the trainer's seconds per step")
    if shape.scoring_servers and costs.scoring_sequence_s is None:
        raise ValueError("the recipe scores on a stage of its own and no compiled reward model forward was read "
                         "(rlax compile --roles reward_model --programs 'reward model')")
    concurrent = min(shape.concurrent_sequences, costs.decode_slots)
    sync_s = (shape.weight_bytes / (shape.trainer_hosts * shape.host_network_bytes_per_s)
              + shape.weight_bytes / shape.host_network_bytes_per_s)
    return FleetParams(
        workers=shape.rollout_workers, max_staleness=shape.max_staleness, groups_per_step=shape.groups_per_step,
        seconds_per_token=costs.decode_step_at(concurrent, shape.mean_context) / concurrent,
        tokens_per_group=shape.samples_per_prompt * shape.completion_tokens,
        trainer_step_s=trainer_step_s if trainer_step_s is not None else compiled_trainer_step_s(costs, shape),
        weight_sync_s=sync_s, groups_per_unit=shape.groups_per_unit,
        group_overhead_s=costs.prefill_per_group_s(shape.prompt_tokens), steps=steps, warmup_steps=steps // 5,
        decode_step_s=lambda n: costs.decode_step_at(n, shape.mean_context),
        samples_per_group=shape.samples_per_prompt, sequences_per_worker=concurrent,
        scoring_servers=shape.scoring_servers,
        scoring_s_per_group=shape.samples_per_prompt * costs.scoring_sequence_s if shape.scoring_servers else 0.0)


def compiled_trainer_step_s(costs: CompiledCosts, shape: FleetShape) -> float:
    """The update step's seconds: the loop-corrected figure, or an older report's scaled by the shape."""
    if costs.update_step_s is not None:
        return costs.update_step_s
    return shape.update_iterations * shape.layer_loop_factor * costs.update_micro_batch_s


def bound_by(result, busy: float = 0.95) -> str:
    """The stage that sets the step: the busiest of the rollout fleet, the scoring stage and the
    trainer where it is busy ``busy`` of the time or more; else "latency": no stage is saturated and
    the step is the loop's round trip (generation, scoring, training and the weight sync of a step)
    over the k + 1 steps pacing lets it hold in flight."""
    stages = {"rollout": result.worker_busy_fraction, "scoring": result.scoring_busy_fraction,
              "trainer": 1.0 - result.trainer_idle_fraction}
    stage = max(stages, key=stages.get)
    return stage if stages[stage] >= busy else "latency"


def predict(costs: CompiledCosts, shape: FleetShape, steps: int = 40,
            trainer_step_s: float | None = None) -> dict[str, Any]:
    """Seconds per step, rollout tokens/s, trainer idle fraction and staleness of the simulated fleet,
    with every input and where it comes from (compiled, recipe or assumed: a given ``trainer_step_s``)."""
    params = fleet_params(costs, shape, steps, trainer_step_s)
    result = simulate(params)
    prefill = costs.prefill_for(shape.prompt_tokens)
    trained = sum(result.staleness.values())
    return {
        "inputs": {
            "decode_step_s": {"value": params.decode_step_s(params.sequences_per_worker), "from": (
                f"compiled: decode of {costs.decode_slots} slots on {costs.rollout_chip}, roofline with the KV "
                f"pages of {params.sequences_per_worker} sequences at {shape.mean_context:,.0f} tokens"
                if costs.decode is not None else
                f"compiled: decode of {costs.decode_slots} slots on {costs.rollout_chip}, roofline (no KV reads)")},
            "concurrent_sequences": {"value": min(shape.concurrent_sequences, costs.decode_slots),
                                     "from": f"recipe: slots and pages, engine.admission={shape.admission}"},
            "prefill_per_group_s": {"value": params.group_overhead_s, "from": (
                f"compiled: prefill {prefill[1]}x{prefill[0]} on {costs.rollout_chip}, one row" if prefill
                else "assumed: 0, no prefill program was compiled")},
            "update_micro_batch_s": {"value": costs.update_micro_batch_s,
                                     "from": f"compiled: update step on {costs.trainer_chip}, roofline"
                                     if costs.update_micro_batch_s is not None else "not compiled"},
            "trainer_step_s": {"value": params.trainer_step_s, "from": (
                "assumed: given" if trainer_step_s is not None else
                "compiled: the update's roofline, each loop at its trip count" if costs.update_step_s is not None else
                f"compiled: the update's roofline x {shape.update_iterations} micro-batches"
                f" x {shape.layer_loop_factor:.2f} (layers)")},
            "weight_sync_s": {"value": params.weight_sync_s, "from": f"recipe: {shape.weight_bytes} bytes; assumed: "
                              f"{shape.host_network_bytes_per_s * 8 / 1e9:g} Gbps per host"},
            "scoring_s_per_group": {"value": params.scoring_s_per_group, "from": (
                f"compiled: {costs.scoring_program}, loop-corrected roofline over its rows x "
                f"{shape.samples_per_prompt} samples; recipe: {shape.scoring_servers} scoring chip(s)"
                if shape.scoring_servers
                else "none: scoring overlaps generation")},
            "prompt_tokens": {"value": shape.prompt_tokens, "from": "assumed"},
            "completion_tokens": {"value": shape.completion_tokens, "from": "assumed"},
            "workers": {"value": shape.rollout_workers, "from": "recipe"},
            "groups_per_step": {"value": shape.groups_per_step, "from": "recipe"},
            "max_staleness": {"value": shape.max_staleness, "from": "recipe"},
        },
        "seconds_per_step": result.seconds_per_step,
        "rollout_tokens_per_s": result.groups_per_s * params.tokens_per_group,
        "rollout_tokens_per_s_per_chip": result.groups_per_s * params.tokens_per_group
        / (shape.rollout_workers * shape.chips_per_worker),
        "engine_tokens_per_s_per_chip": params.sequences_per_worker / params.decode_step_s(params.sequences_per_worker)
        / shape.chips_per_worker,
        "groups_per_s": result.groups_per_s,
        "trainer_idle_fraction": result.trainer_idle_fraction,
        "worker_busy_fraction": result.worker_busy_fraction,
        "scoring_busy_fraction": result.scoring_busy_fraction,
        "bound_by": bound_by(result),
        "staleness": {str(lag): n / trained for lag, n in result.staleness.items()},
        "generation_s_per_step_one_worker": params.groups_per_step * params.seconds_per_group,
    }
