"""The rollout engine: prompts and sampling parameters in, completions with log-probs out.

    engine = Engine(EngineConfig(num_slots=16), model_config, params, version=0)
    sampling = SamplingParams(temperature=1.0, samples_per_prompt=4)
    completions = engine.generate([Request(prompt_ids, sampling, "gsm8k/17", seed=3)])
    engine.update_weights(new_params, version=1)     # the next generate() runs on version 1
    engine.update_adapters(adapters, lora, version=2)  # LoRA adapters on the last full params given

How it runs. A fixed number of slots decode together. Each sample of each request waits in a FIFO
queue until a slot is free and the page pool gives it the pages its admission rule asks for
(``EngineConfig.admission``, ``pages``): under ``on_demand`` its prompt's plus one decode call's
look-ahead. Admitted prompts are prefilled together (left-padded to a length bucket, batch padded
to a power of two, or to one size with ``batch_invariant``), all but their last token, and once per
request: the other samples of a request admitted with it point at its full prompt pages and copy its
partial last one. Before each decode call every running sequence takes the pages the call may
write; when the pool runs out, the running sequence queued last is preempted (its pages freed,
itself back at the head of the queue); it resumes with its pages swapped back from host memory or
recomputed (``preemption``). Its keys depend only on its seed, prompt id, sample index and token
index: swapped, its tokens and log-probs are bit for bit those without preemption; recomputed, its
log-probs agree within rounding, and its tokens unless a draw lies that close to a boundary.
Then one compiled call decodes ``decode_steps_per_call`` tokens for all slots in a
``lax.while_loop`` (no Python per token); its first step for a new sample runs the last prompt
token and samples the first new one. Control returns to Python, which retires finished sequences,
frees their pages and admits new samples at once (continuous batching). Every compiled shape is
fixed by ``EngineConfig``, so after warm-up nothing recompiles whatever the prompt lengths,
sampling settings, preemptions or batch fill.

Weights are an argument of the compiled programs, not a constant in them, so ``update_weights``
swaps them without recompiling. What running sequences do is ``EngineConfig.on_new_version``:
"continue" installs the new weights before the next decode call and they go on under them;
"recompute" recomputes their caches under them first; "drain" pauses admission until they (and any
preempted sequence) finish on the weights they started with. Every completion records the version
of each of its tokens.

Adapter versions (``update_adapters``) apply to the base the engine holds (the last full params
given, or the base handed over with them), merged into its kernels or run on the fly beside them
(``EngineConfig.lora_mode``). A rollout worker's follower hands them over so (``WeightFollower.hand_to``).

The host side is split by what each part owns: ``sequences`` the request and sample records,
``pages`` which sequence holds which pages, ``batch`` the slots and stop rules, ``episodes`` the
turns between their calls, ``preemption`` a preempted sequence's cache, ``placement`` the devices and the platform's programs. This module
orders them: admission, prefill, decode, retirement, weight swaps, and the output order.

A mixture of experts records the experts each position ran in each sparse layer (router replay,
``Completion.routed_experts``): the prompt's from its prefill (a sibling takes its owner's), each fed
token's from the decode step that fed it, an episode's observations from the call that computed them
into its pages. A position computed again (a preemption, a recomputing swap, an episode's history
under new weights) records the recomputation's experts: those the cache that later tokens read ran.

Numerics: see ``sampling`` for the keys (per seed, prompt id, sample index, token index) and for
the log-probs (float32 log_softmax of the raw logits, i.e. the untempered, unfiltered policy). A
sample's numbers do not depend on its slot or its decode batch; on the prompts prefilled with it
they do in the last bits, unless ``EngineConfig.batch_invariant`` (then bit for bit its own).
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from typing import Any, Callable, Sequence

import jax
import numpy as np

from rlax_core.inference import preemption, programs
from rlax_core.inference.adapters import apply_adapters
from rlax_core.inference.batch import MAX_STOP_TOKEN_IDS, DecodeBatch
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.continuation import extend, feed_uncached
from rlax_core.inference.episodes import EpisodeTurns
from rlax_core.inference.kv_cache import KVCache
from rlax_core.inference.pages import PagePool
from rlax_core.inference.phase_clock import PhaseClock, timed
from rlax_core.inference.placement import Placement, held_shapes, kernels_for, lora_mode_for
from rlax_core.inference.sampling import SamplingMode
from rlax_core.inference.sequences import Completion, FinishReason, Request, SequenceState, check_request
from rlax_core.models.config import ModelConfig
from rlax_core.models.lora_config import LoraConfig

logger = logging.getLogger(__name__)

__all__ = ["Completion", "Engine", "Request"]


class Engine:
    """Load once, generate many times. Not re-entrant: one ``generate`` at a time per engine.

    ``detokenize`` (ids -> text) is needed only for requests with stop strings. ``device``: where
    the weights and the cache live and every program runs (default: JAX's default device); one
    engine per device is ``ReplicatedEngine``. With ``config.tensor_parallel`` N > 1 the replica
    spans ``devices`` instead (default: the first N local devices): weights and cache are sharded
    over them (``sharding``).
    """

    def __init__(self, config: EngineConfig, model_config: ModelConfig, params: Any, version: int = 0,
                 detokenize: Callable[[Sequence[int]], str] | None = None, device: jax.Device | None = None,
                 devices: Sequence[jax.Device] | None = None):
        if config.replicas != 1:
            raise ValueError(f"engine.replicas={config.replicas}: an Engine is one replica; build a ReplicatedEngine")
        if config.num_pages == "auto":
            raise ValueError("engine.num_pages=auto is sized from the declared chips when a run config is loaded "
                             "(planning.memory.auto_num_pages); an Engine needs the number")
        self.config = config
        self.model_config = model_config
        self.detokenize = detokenize
        self._placement = Placement(config, model_config, device, devices)
        self.device, self.mesh, self.devices = device, self._placement.mesh, self._placement.devices
        platform = self._placement.platform
        self._param_shapes = held_shapes(params, config.weight_dtype)
        self._params, self._version = self._placement.layout(params), int(version)
        self._base = self._params  # what adapter versions apply to: the last full params given
        self.lora_mode = lora_mode_for(config.lora_mode, platform)
        self._pending_weights: tuple[Any, int] | None = None
        self._kernels = kernels_for(config, platform)
        self._cache = self._placement.allocate_cache(config)
        self.pages = PagePool(config.num_pages, config.page_size, config.admission, config.decode_steps_per_call)
        self._batch = DecodeBatch(config, model_config.eos_token_ids, detokenize)
        self._queue: deque[SequenceState] = deque()
        self._episodes = EpisodeTurns(config, model_config.vocab_size, self.pages, self._extend_pages,
                                      stop_strings_allowed=detokenize is not None)
        self._finished: list[SequenceState] = []
        # A mixture of experts records each position's routed experts (router replay): their shape and dtype.
        moe = model_config.moe
        self._moe_layers = () if moe is None else (len(model_config.moe_layers), moe.experts_per_token)
        self._expert_id_dtype = None if moe is None else moe.expert_id_dtype
        self._next_order = 0
        self.clock: PhaseClock | None = None  # a measurement's: seconds per program (``phase_clock``)
        self.stats = {"prefill_calls": 0, "shared_prefills": 0, "decode_calls": 0, "decode_steps": 0, "tokens": 0,
                      "weight_swaps": 0, "extend_calls": 0, "extended_tokens": 0, "preemptions": 0,
                      "recomputed": 0, "peak_pages_in_use": 0}
        # Module-level programs keyed by static shapes: engines with equal configs share compilations.
        self._prefill = functools.partial(programs.prefill, model_config=model_config, mesh=self.mesh,
                                          attention=self._kernels.prefill_attention)
        self._copy_pages = functools.partial(programs.copy_pages, mesh=self.mesh)
        self._decode = functools.partial(self._kernels.decode, model_config=model_config,
                                         chunk=config.decode_steps_per_call, attention=self._kernels.decode_attention,
                                         mesh=self.mesh, interpret=self._kernels.interpret)

    # ------------------------------------------------------------------ public API

    @property
    def version(self) -> int:
        """The weight version new sequences start on."""
        return self._version

    @property
    def params(self) -> Any:
        """The weights new sequences start on, in the decoding layout (a pending swap not yet taken)."""
        return self._params

    @property
    def cache(self) -> KVCache:
        """The KV pool as it stands between calls (what the memory planner counts)."""
        return self._cache

    @property
    def attention(self) -> str:
        """The decode attention this engine runs (``placement.Kernels.decode_attention``)."""
        return self._kernels.decode_attention

    def active_slots(self) -> int:
        """Slots decoding a sequence now."""
        return self._batch.active()

    def parked_episodes(self) -> int:
        """Episodes whose turn has finished and whose pages wait for the next turn or their end."""
        return self._episodes.parked()

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """Complete every request ``samples_per_prompt`` times; results in request order, then sample index."""
        if self.has_unfinished():
            raise RuntimeError("generate() called while other requests are in flight; use add_request/step")
        for request in requests:
            self.add_request(request)
        completions = []
        while self.has_unfinished():
            completions.extend(self.step())
        completions.extend(self._drain_finished())
        return [completion for _, completion in sorted(completions, key=lambda pair: pair[0])]

    def add_request(self, request: Request) -> None:
        """Queue ``request`` (all of its samples); bad requests fail here with the reason."""
        self._validate(request)
        for sample_index in range(request.sampling.samples_per_prompt):
            self._queue.append(SequenceState(self._take_order(), request, sample_index))

    def warm_up(self, modes: Sequence[SamplingMode] = tuple(SamplingMode), *, episodes: bool = False) -> None:
        """Compile every program ``generate`` may call for these sampling modes, now.

        That is one prefill per (batch bucket, prompt-length bucket), one page copy per prompt-length
        bucket, and one decode per window width and mode; with ``episodes``, pages on demand or
        recomputed swaps, also the continuation that feeds tokens into pages that hold a sequence's
        earlier ones (an episode's next turn, a preempted sequence's resumption), per (batch
        bucket, length bucket), and with swapped preemptions the swap's read and write. Call it when a worker starts so that no request pays for a
        compilation: afterwards nothing compiles, whatever lengths, fills, turns and sampling settings
        arrive. It runs each program on an idle batch, which writes only the sink page.
        """
        if self.has_unfinished():
            raise RuntimeError("warm_up() needs an idle engine")
        config = self.config
        for batch in config.prefill_batch_sizes:
            for length in config.prefill_buckets:
                padding = np.zeros((batch, length), np.int32)
                no_pages = np.zeros((batch, config.pages_per_sequence), np.int32)
                self._cache, _ = self._prefill(self._params, self._cache, padding, padding - 1, no_pages)
        for pages in sorted({self.pages.pages_for(length) for length in config.prefill_buckets}):
            sink = np.zeros((config.num_slots, pages), np.int32)
            self._cache = self._copy_pages(self._cache, sink, sink)
        if episodes or config.admission == "on_demand" or config.on_new_version == "recompute":
            for batch in config.continuation_batch_sizes:
                for length in config.prefill_buckets:  # rows of padding only, written to the sink page
                    self._extend_pages(np.zeros((batch, length), np.int32), np.full((batch, length), -1, np.int32),
                                       np.zeros((batch, config.pages_per_sequence), np.int32))
        if config.admission == "on_demand" and config.swaps_preempted:
            self._cache = preemption.warm_up(self._cache, config, self.mesh)
        for mode in modes:
            for width in self._kernels.window_widths:  # no slot is active: each decode loop exits at once
                *_, self._cache = self._decode(self._params, self._cache, self._batch.inputs(width), mode=mode)
        jax.block_until_ready(self._cache)

    def has_unfinished(self) -> bool:
        return bool(self._queue) or self._episodes.queued() or self._batch.active() > 0

    def continue_episode(self, episode: int, observation_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Append ``observation_ids`` to a finished turn of ``episode`` and queue its next turn.

        The history stays in the episode's pages: only the new tokens are computed. See ``episodes``.
        """
        self._episodes.continue_(episode, observation_ids, sampling, order=self._next_order)
        self._next_order += 1

    def end_episode(self, episode: int) -> None:
        """Free the pages of an episode whose last turn has finished."""
        self._episodes.end(episode)

    def step(self) -> list[tuple[int, Completion]]:
        """Admit and prefill what fits, decode one chunk, retire what finished: (order, completion) pairs."""
        self._maybe_swap_weights()
        while True:
            self._admit_all()
            if self._batch.active():
                self._make_room()
                if self._batch.active():
                    break
            if not (self._queue or self._episodes.queued()):
                break
            # Nothing can run: the queues' heads find no pages, episodes between turns hold them.
            if not self._episodes.evict():
                raise RuntimeError("the queued sequences cannot get pages and nothing holds any; "
                                   "engine.num_pages is below one sequence's budget")
        if self._batch.active():
            self._decode_chunk()
        return self._drain_finished()

    def update_weights(self, params: Any, version: int) -> None:
        """Use ``params`` (same structure, shapes and dtypes: no recompilation) from the next decode
        call (``on_new_version`` continue or recompute) or once the sequences in flight finish (drain)."""
        self._check_shapes(params, "update_weights")
        if self.config.on_new_version != "drain":
            # Installed before the next decode call: the current version goes first, so that two
            # are never resident (the planner counts one).
            self._params = self._base = self._pending_weights = None
        self._base = self._placement.layout(params)
        self._pending_weights = (self._base, int(version))
        self._maybe_swap_weights()

    def update_adapters(self, adapters: Any, lora: LoraConfig, version: int, base: Any = None) -> None:
        """As ``update_weights``, for LoRA adapters (``models.lora``'s stacked tree, as an adapter
        weight version holds them) on the engine's base: ``base`` when given (full params, which the
        engine holds from now on), else the last full params it was given.

        ``lora_mode`` "merged" swaps in W + alpha / rank * A @ B; "on_the_fly" swaps in the base with
        the adapters beside its kernels, and every projection adds (x @ A) @ B. The first adapters of
        a rank compile the programs for that tree once; later versions swap without compiling.
        """
        if self.config.weight_dtype != "bfloat16":
            raise ValueError(f"engine.weight_dtype={self.config.weight_dtype} does not take LoRA adapters yet "
                             "(an adapter merged into an eight-bit kernel would be rounded away); use bfloat16")
        if base is not None:
            self._base = self._laid_out_base(base, "update_adapters")
        params = apply_adapters(self._base, adapters, lora, self.lora_mode, model_config=self.model_config,
                                mesh=self.mesh, device=self.device)
        self._pending_weights = (params, int(version))
        self._maybe_swap_weights()

    def _check_shapes(self, params: Any, caller: str) -> None:
        if held_shapes(params, self.config.weight_dtype) != self._param_shapes:
            raise ValueError(f"{caller}: the new parameters differ in structure, shape or dtype from the "
                             "engine's; build a new Engine for a different model")

    def _laid_out_base(self, params: Any, caller: str) -> Any:
        self._check_shapes(params, caller)
        return self._placement.layout(params)

    # ------------------------------------------------------------------ scheduling (host)

    def _take_order(self) -> int:
        self._next_order += 1
        return self._next_order - 1

    def _validate(self, request: Request) -> None:
        sampling = request.sampling
        check_request(request, self.config, self.model_config.vocab_size)
        if len(self._batch.stop_ids(sampling)) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"request {request.prompt_id!r}: at most {MAX_STOP_TOKEN_IDS} stop token ids (EOS included)")
        if sampling.stop_strings and self.detokenize is None:
            raise ValueError(f"request {request.prompt_id!r}: stop_strings need an Engine built with detokenize=")
        if request.episode_tokens:
            self._episodes.validate_first_turn(request)

    def _admit_all(self) -> None:
        if self._pending_weights is None:
            # Continued turns first: they hold their pages already, and finishing episodes frees pages.
            for slot, turn in self._episodes.admit(self._batch.free_slots(), self._version):
                self._batch.start(slot, turn)
        self._admit()

    def _admit(self) -> None:
        """Move queued samples into free slots while the pool gives their pages; prefill them together.

        A preempted sample resumes ahead of every new one. While a drained swap waits, only those
        resume (they finish on the version they started on)."""
        free_slots = self._batch.free_slots()
        admitted: list[tuple[int, SequenceState]] = []
        owners: dict[int, SequenceState] = {}  # id(request) -> the sample admitted now whose pages hold its prompt
        siblings: list[tuple[SequenceState, SequenceState]] = []  # (sample, owner) sharing the owner's prompt
        resumed_now: list[SequenceState] = []
        while self._queue and len(admitted) < len(free_slots):
            seq = self._queue[0]
            resumed = seq.version >= 0
            if self._pending_weights is not None and not resumed:
                break
            owner = None if resumed else owners.get(id(seq.request))
            if owner is not None:
                self.pages.share(owner, seq, self._full_prompt_pages(seq))
            if not self.pages.admit(seq, seq.length, running=self._batch.active() + len(admitted)):
                self.pages.release(seq)
                break  # FIFO: the head waits for pages rather than being overtaken and starved
            self._queue.popleft()
            seq.sample_under(self._version)
            seq.cache_version = self._version
            if self._moe_layers and seq.routed_experts is None:  # an episode's: its whole budget, kept between turns
                seq.routed_experts = np.zeros((seq.request.budget, *self._moe_layers), self._expert_id_dtype)
            if seq.request.episode_tokens and seq.episode is None:
                seq.episode = self._episodes.new_handle()
            if resumed:
                resumed_now.append(seq)
            elif owner is None:
                owners[id(seq.request)] = seq
            else:
                siblings.append((seq, owner))
            admitted.append((free_slots[len(admitted)], seq))
        if admitted:
            self._prefill_group(admitted, list(owners.values()), siblings, resumed_now)

    def _full_prompt_pages(self, seq: SequenceState) -> int:
        """Pages the cached part of ``seq``'s prompt (all but its last token) fills whole: no decode
        step writes them, so the samples of a prompt share them."""
        return (len(seq.request.prompt_ids) - 1) // self.config.page_size

    def _prefill_group(self, admitted: list[tuple[int, SequenceState]], owners: list[SequenceState],
                       siblings: list[tuple[SequenceState, SequenceState]], resumed: list[SequenceState]) -> None:
        """Cache every admitted sequence but its last token; start the slots.

        The first decode step runs each sample's last prompt token and samples its first token
        with the sample's own key. So the samples of one request share one prefill: the first
        sample admitted (its owner) computes the prompt, its siblings admitted with it point at its
        full pages and copy its partial last page (which each writes on). A resumed sequence
        recomputes its prompt and tokens so far into fresh pages.
        """
        config = self.config
        prefixes = [seq for seq in owners if len(seq.request.prompt_ids) > 1]
        for rows, batch, length in config.prefill_calls([len(seq.request.prompt_ids) - 1 for seq in prefixes]):
            self._prefill_prompts([prefixes[row] for row in rows], batch, length)
        self._copy_partial_pages(siblings)
        for seq, owner in siblings:  # the owner's prefill computed their prompt
            if owner.routed_experts is not None:
                seq.record_routing(0, owner.routed_experts[:len(seq.request.prompt_ids) - 1])
        for seq in resumed:
            if seq.swapped is not None:
                with timed(self.clock, "swap", lambda: self._cache):
                    self._cache = preemption.restore(self._cache, seq, config, self.mesh)
        feed_uncached(resumed, config, self._extend_pages)  # the others: recomputed
        for slot, seq in admitted:
            self._batch.start(slot, seq)
        self.stats["peak_pages_in_use"] = self.pages.peak_in_use

    def _prefill_prompts(self, prefixes: list[SequenceState], batch: int, length: int) -> None:
        """One prefill call: these prompts but their last tokens, left-padded to ``length``, into their pages."""
        config = self.config
        tokens = np.zeros((batch, length), np.int32)
        positions = np.full((batch, length), -1, np.int32)
        page_table = np.zeros((batch, config.pages_per_sequence), np.int32)
        for row, seq in enumerate(prefixes):
            prefix = np.asarray(seq.request.prompt_ids[:-1], np.int32)
            tokens[row, length - len(prefix):] = prefix  # left-padded: positions say where each token goes
            positions[row, length - len(prefix):] = np.arange(len(prefix))
            page_table[row, : len(seq.pages)] = seq.pages
        with timed(self.clock, "prefill", lambda: self._cache):
            self._cache, routed = self._prefill(self._params, self._cache, tokens, positions, page_table)
        self.stats["prefill_calls"] += 1
        if routed is not None:
            routed = np.asarray(routed)
            for row, seq in enumerate(prefixes):
                seq.record_routing(0, routed[row, length - len(seq.request.prompt_ids) + 1:])

    def _copy_partial_pages(self, siblings: list[tuple[SequenceState, SequenceState]]) -> None:
        """Copy each sibling's partial last prompt page from its owner's (copy on write: both write on)."""
        width = self.pages.pages_for(self.config.prefill_buckets[0])  # the narrowest copy compiled
        source = np.zeros((self.config.num_slots, width), np.int32)  # sink -> sink in unused rows
        target = np.zeros_like(source)
        copies = 0
        for seq, owner in siblings:
            if (len(seq.request.prompt_ids) - 1) % self.config.page_size:
                full = self._full_prompt_pages(seq)
                source[copies, 0], target[copies, 0] = owner.pages[full], seq.pages[full]
                copies += 1
        if copies:
            self._cache = self._copy_pages(self._cache, source, target)
        self.stats["shared_prefills"] += len(siblings)

    def _extend_pages(self, tokens: np.ndarray, positions: np.ndarray, page_table: np.ndarray) -> np.ndarray | None:
        """Compute tokens into their sequences' pages over what those hold (an episode's next turn, a
        resumed sequence); a mixture of experts' routed ids of those tokens."""
        with timed(self.clock, "prefill", lambda: self._cache):  # a resumed sample's recomputation too
            self._cache, routed = extend(self._params, self._cache, tokens, positions, page_table,
                                         model_config=self.model_config, mesh=self.mesh)
        self.stats["extend_calls"] += 1
        self.stats["extended_tokens"] += int((positions >= 0).sum())
        return None if routed is None else np.asarray(routed)

    def _make_room(self) -> None:
        """Give every running sequence the pages the next decode call may write, oldest first; when
        the pool runs out, preempt the running sequence queued last until they fit."""
        steps = self.config.decode_steps_per_call
        for slot, seq in sorted(self._batch.running(), key=lambda pair: pair[1].order):
            while self._batch.sequence(slot) is seq and not self.pages.grow(
                    seq, min(seq.length - 1 + steps, seq.request.budget)):
                self._preempt(*max(self._batch.running(), key=lambda pair: pair[1].order))
            if self._batch.sequence(slot) is seq:
                self._batch.set_pages(slot, seq)
        self.stats["peak_pages_in_use"] = self.pages.peak_in_use

    def _preempt(self, slot: int, seq: SequenceState, counter: str = "preemptions") -> None:
        """Free ``seq``'s slot and pages and queue it to resume ahead of every new sample, in order."""
        self._batch.vacate(slot)
        swap = self.config.swaps_preempted and counter == "preemptions"
        with timed(self.clock if swap else None, "swap", lambda: None):  # host copies, read synchronously
            preemption.leave(self._cache, seq, self.config, swap)
        self.pages.release(seq)
        resumed_before = (i for i, queued in enumerate(self._queue) if queued.version < 0 or queued.order >= seq.order)
        self._queue.insert(next(resumed_before, len(self._queue)), seq)
        self.stats[counter] += 1

    def _decode_chunk(self) -> None:
        # Attention reads the pages in use rather than the longest sequence's worth, which matters
        # most early in long generations; the widths bound the compiled variants.
        width = next(w for w in self._kernels.window_widths if w >= self._batch.pages_touched())
        with timed(self.clock, "decode", lambda: self._cache):
            tokens, logprobs, steps, state, routed, self._cache = self._decode(
                self._params, self._cache, self._batch.inputs(width), mode=self._batch.mode())
        ended, sampled = self._batch.take(np.asarray(tokens), np.asarray(logprobs), int(steps), state,
                                          None if routed is None else np.asarray(routed))
        self.stats["decode_calls"] += 1
        self.stats["decode_steps"] += int(steps)
        self.stats["tokens"] += sampled
        for slot, reason in ended:
            self._retire(slot, reason)

    def _retire(self, slot: int, reason: FinishReason) -> None:
        seq = self._batch.vacate(slot)
        if seq.episode is not None:
            self._episodes.park(seq)  # its pages wait for the next turn or end_episode
        else:
            self.pages.release(seq)
        seq.finish_reason = reason
        self._finished.append(seq)

    def _drain_finished(self) -> list[tuple[int, Completion]]:
        done, self._finished = self._finished, []
        return [(seq.order, seq.completion()) for seq in done]

    def _maybe_swap_weights(self) -> None:
        if self._pending_weights is None:
            return
        mode = self.config.on_new_version
        if mode == "drain" and (self._batch.active() or any(seq.version >= 0 for seq in self._queue)):
            return  # drained: the sequences in flight, preempted ones too, finish on their version
        (self._params, self._version), self._pending_weights = self._pending_weights, None
        self.stats["weight_swaps"] += 1
        if mode == "recompute":  # preempted sequences' swapped pages hold the old version's keys
            preemption.forget(self._queue)
        for slot, seq in self._batch.running():
            if mode == "recompute":
                self._preempt(slot, seq, counter="recomputed")  # resumes at once, its cache recomputed
            else:
                seq.sample_under(self._version)
        logger.info("engine now on weight version %d", self._version)
