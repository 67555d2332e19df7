"""The rollout engine: prompts and sampling parameters in, completions with log-probs out.

    engine = Engine(EngineConfig(num_slots=16), model_config, params, version=0)
    sampling = SamplingParams(temperature=1.0, samples_per_prompt=4)
    completions = engine.generate([Request(prompt_ids, sampling, "gsm8k/17", seed=3)])
    engine.update_weights(new_params, version=1)     # the next generate() runs on version 1
    engine.update_adapters(adapters, lora, version=2)  # LoRA adapters on the last full params given

How it runs. A fixed number of slots decode together. Each sample of each request waits in a FIFO
queue until a slot is free and the page allocator can reserve every page the sample may need
(prompt + its max_new_tokens): that admission control means a running sequence never runs out of
cache. Admitted prompts are prefilled together (left-padded to a length bucket, batch padded to a
power of two), all but their last token, and once per request: the other samples of a request
admitted with it copy its prompt pages. Then one compiled call decodes ``decode_steps_per_call``
tokens for all slots in a ``lax.while_loop`` (no Python per token); its first step for a new
sample runs the last prompt token and samples the first new one. Control returns to Python, which
retires finished sequences, frees their pages and admits new samples at once (continuous batching). Every compiled shape is fixed by ``EngineConfig``, so after warm-up
nothing recompiles whatever the prompt lengths, sampling settings or batch fill.

Weights are an argument of the compiled programs, not a constant in them, so ``update_weights``
swaps them without recompiling. A swap requested while sequences are in flight waits: admission
pauses, the in-flight sequences finish on the weights they started with, then the new weights take
over. Every completion therefore comes from exactly one version, which it carries.

Adapter versions (``update_adapters``) apply to the base the engine holds (the last full params
given, or the base handed over with them), merged into its kernels or run on the fly beside them
(``EngineConfig.lora_mode``). A rollout worker's follower hands them over so (``WeightFollower.hand_to``).

Numerics: see ``sampling`` for the keys (per seed, prompt id, sample index, token index) and for
the log-probs (float32 log_softmax of the raw logits, i.e. the untempered, unfiltered policy).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections import deque
from typing import Any, Callable, Literal, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.inference import programs
from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.episodes import EpisodeTurns
from rlax_core.inference.kv_cache import KVCache, PageAllocator, init_kv_cache, kv_pool_shape, pages_needed
from rlax_core.inference.pallas_attention import kernel_for_backend
from rlax_core.inference.sharding import (decoding_param_shardings, engine_mesh, kv_pool_sharding,
                                          stacked_param_shardings)
from rlax_core.inference.sampling import SamplingMode, prompt_key_id
from rlax_core.models.attention import attention_for_platform
from rlax_core.models.config import ModelConfig
from rlax_core.inference.adapters import apply_adapters
from rlax_core.models.lora import LoraConfig
from rlax_core.models.transformer import unstack_layers

logger = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "abort"]
MAX_STOP_TOKEN_IDS = 8  # stop ids per sequence checked on the device (EOS ids included)
# engine.lora_mode "auto", per platform: the mode benchmarks/adapter_serving.py measured faster (docs/lora.md).
MEASURED_FASTER_LORA_MODE = {"cpu": "merged"}


@dataclasses.dataclass(frozen=True)
class Request:
    """One prompt to complete ``sampling.samples_per_prompt`` times; ``prompt_id`` and ``seed`` fix the
    samples' keys."""

    prompt_ids: Sequence[int]
    sampling: SamplingParams = SamplingParams()
    prompt_id: int | str = 0
    seed: int = 0
    # > 0: each sample is the first turn of an episode of at most this many tokens (prompt, turns and
    # observations): its pages are reserved for all of them and kept between turns (``continue_episode``).
    episode_tokens: int = 0


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sample. ``logprobs[i]`` is the float32 log-softmax of the raw logits at ``completion_ids[i]``."""

    prompt_id: int | str
    sample_index: int
    seed: int
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    weight_version: int
    episode: int | None = None  # an episode's handle for ``continue_episode`` / ``end_episode``


@dataclasses.dataclass
class _Sequence:
    """Host-side bookkeeping of one sample from admission to retirement."""

    order: int  # position in the output of the generate() call
    request: Request
    sample_index: int
    pages: list[int] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    version: int = -1
    finish_reason: FinishReason | None = None
    text_checked_upto: int = 0  # tokens already searched for stop strings
    episode: int | None = None  # set for the turns of an episode (``episode_tokens``)
    cached: int = 0  # leading prompt tokens already in its pages (a continued episode)
    key_offset: int = 0  # policy tokens of the episode's earlier turns: the keys' token index starts there
    cache_version: int = -1  # the weight version that computed its cached tokens


class SlotState:
    """Per-slot decode state as numpy arrays: uploaded before each decode call, read back after."""

    FIELDS = {
        "active": np.bool_, "last_token": np.int32, "length": np.int32, "generated": np.int32,
        "max_new": np.int32, "seed": np.int32, "prompt_key": np.int32, "sample_index": np.int32,
        "temperature": np.float32, "top_k": np.int32, "top_p": np.float32,
    }

    def __init__(self, num_slots: int, pages_per_sequence: int):
        for name, dtype in self.FIELDS.items():
            setattr(self, name, np.zeros(num_slots, dtype))
        self.stop_ids = np.full((num_slots, MAX_STOP_TOKEN_IDS), -1, np.int32)
        self.page_table = np.zeros((num_slots, pages_per_sequence), np.int32)

    def as_dict(self) -> dict[str, np.ndarray]:
        names = [*self.FIELDS, "stop_ids", "page_table"]
        return {name: getattr(self, name) for name in names}


def sampling_mode(sampling: SamplingParams) -> SamplingMode:
    """The compiled sampling program a request runs under (what ``warm_up(modes=...)`` compiles)."""
    if sampling.greedy:
        return SamplingMode.GREEDY
    return SamplingMode.FILTERED if sampling.filtered else SamplingMode.TEMPERATURE


def _geometric_buckets(limit: int, growth: float = 1.25) -> tuple[int, ...]:
    """1, 2, 3, 4, 5, 7, 9, 12, ... up to ``limit``: a width is padded by at most a quarter."""
    sizes, size = [], 1
    while size < limit:
        sizes.append(size)
        size = max(size + 1, math.ceil(size * growth))
    return (*sizes, limit)


def _power_of_two_buckets(limit: int) -> tuple[int, ...]:
    sizes, size = [], 1
    while size < limit:
        sizes.append(size)
        size *= 2
    return (*sizes, limit)


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
        self.config = config
        self.model_config = model_config
        self.detokenize = detokenize
        self.device, self.mesh, self._relayout = device, None, None
        if config.tensor_parallel > 1:
            if device is not None:
                raise ValueError("a tensor-parallel Engine takes devices=, not one device")
            devices = list(jax.local_devices()[:config.tensor_parallel] if devices is None else devices)
            if len(devices) != config.tensor_parallel:
                raise ValueError(f"engine.tensor_parallel={config.tensor_parallel} needs that many devices; "
                                 f"got {len(devices)}")
            self.mesh = engine_mesh(devices)
        elif devices is not None:
            raise ValueError("devices= is for a tensor-parallel Engine (engine.tensor_parallel > 1); use device=")
        self.devices = list(self.mesh.devices.flat) if self.mesh is not None else [device or jax.devices()[0]]
        platform = self.devices[0].platform
        self._param_shapes = jax.tree.map(lambda x: (x.shape, x.dtype), params)
        self._params, self._version = self._layout(params), int(version)
        self._base = self._params  # what adapter versions apply to: the last full params given
        self.lora_mode = self.resolve_lora_mode(config.lora_mode, platform)
        self._pending_weights: tuple[Any, int] | None = None
        self.attention = self.resolve_attention(config.attention_impl, platform)
        self._prefill_batches = _power_of_two_buckets(config.prefill_batch)
        # The Pallas kernel reads only the pages in use whatever the table width: one width serves.
        self._window_widths = ((config.pages_per_sequence,) if self.attention == "pallas"
                               else _geometric_buckets(config.pages_per_sequence))
        self._cache = self._allocate_cache()
        self._allocator = PageAllocator(config.num_pages)
        self._slots = SlotState(config.num_slots, config.pages_per_sequence)
        self._running: list[_Sequence | None] = [None] * config.num_slots
        self._queue: deque[_Sequence] = deque()
        self._episodes = EpisodeTurns(self)
        self._finished: list[_Sequence] = []
        self._next_order = 0
        self.stats = {"prefill_calls": 0, "shared_prefills": 0, "decode_calls": 0, "decode_steps": 0, "tokens": 0,
                      "weight_swaps": 0}
        # Module-level programs keyed by static shapes: engines with equal configs share compilations.
        self._prefill = functools.partial(programs.prefill, model_config=model_config, mesh=self.mesh,
                                          attention=attention_for_platform(platform))
        self._copy_pages = functools.partial(programs.copy_pages, mesh=self.mesh)
        decode = programs.decode_on_cpu if platform == "cpu" else programs.decode
        # "pallas" is the backend's own JAX kernel; the CPU interprets one (tests).
        attention = kernel_for_backend(platform) if self.attention == "pallas" else self.attention
        self._decode = functools.partial(decode, model_config=model_config, chunk=config.decode_steps_per_call,
                                         attention=attention, mesh=self.mesh, interpret=platform == "cpu")

    # ------------------------------------------------------------------ public API

    @property
    def version(self) -> int:
        """The weight version new sequences start on."""
        return self._version

    @property
    def params(self) -> Any:
        """The weights new sequences start on, in the decoding layout (a pending swap not yet taken)."""
        return self._params

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
            self._queue.append(_Sequence(self._next_order, request, sample_index))
            self._next_order += 1

    def warm_up(self, modes: Sequence[SamplingMode] = tuple(SamplingMode), *, episodes: bool = False) -> None:
        """Compile every program ``generate`` may call for these sampling modes, now.

        That is one prefill per (batch bucket, prompt-length bucket), one page copy per prompt-length
        bucket, and one decode per window width and mode; with ``episodes``, also the continuation
        that feeds a multi-turn episode's new tokens into its pages (``continue_episode``), per
        (batch bucket, length bucket). Call it when a worker starts so that no request pays for a
        compilation: afterwards nothing compiles, whatever lengths, fills, turns and sampling settings
        arrive. It runs each program on an idle batch, which writes only the sink page.
        """
        if self.has_unfinished():
            raise RuntimeError("warm_up() needs an idle engine")
        config = self.config
        for batch in self._prefill_batches:
            for length in config.prefill_buckets:
                padding = np.zeros((batch, length), np.int32)
                no_pages = np.zeros((batch, config.pages_per_sequence), np.int32)
                self._cache = self._prefill(self._params, self._cache, padding, padding - 1, no_pages)
        for pages in sorted({pages_needed(length, config.page_size) for length in config.prefill_buckets}):
            sink = np.zeros((config.num_slots, pages), np.int32)
            self._cache = self._copy_pages(self._cache, sink, sink)
        if episodes:
            self._episodes.warm_up()
        for mode in modes:
            for width in self._window_widths:  # no slot is active: each decode loop exits at once
                *_, self._cache = self._decode(self._params, self._cache, self._decode_state(width), mode=mode)
        jax.block_until_ready(self._cache)

    def has_unfinished(self) -> bool:
        return bool(self._queue) or self._episodes.queued() or any(seq is not None for seq in self._running)

    def continue_episode(self, episode: int, observation_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Append ``observation_ids`` to a finished turn of ``episode`` and queue its next turn.

        The history stays in the episode's pages: only the new tokens are computed. See ``episodes``.
        """
        self._episodes.continue_(episode, observation_ids, sampling)

    def end_episode(self, episode: int) -> None:
        """Free the pages of an episode whose last turn has finished."""
        self._episodes.end(episode)

    def step(self) -> list[tuple[int, Completion]]:
        """Admit and prefill what fits, decode one chunk, retire what finished: (order, completion) pairs."""
        self._maybe_swap_weights()
        if self._pending_weights is None:
            # Continued turns first: they hold their pages already, and finishing episodes frees pages.
            self._episodes.admit([slot for slot, seq in enumerate(self._running) if seq is None])
            self._admit()
        if any(seq is not None for seq in self._running):
            self._decode_chunk()
        return self._drain_finished()

    def abort(self, prompt_id: int | str) -> None:
        """Stop every sample of ``prompt_id``: queued ones return empty, running ones what they have."""
        for seq in [s for s in self._queue if s.request.prompt_id == prompt_id]:
            self._queue.remove(seq)
            seq.version = self._version
            self._finish(seq, "abort")
        for slot, seq in enumerate(self._running):
            if seq is not None and seq.request.prompt_id == prompt_id:
                self._retire(slot, "abort")
        self._episodes.abort(prompt_id)

    def update_weights(self, params: Any, version: int) -> None:
        """Use ``params`` (same structure, shapes and dtypes: no recompilation) for sequences started from
        now; sequences in flight finish on their own version first."""
        self._base = self._laid_out_base(params, "update_weights")
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
        if base is not None:
            self._base = self._laid_out_base(base, "update_adapters")
        params = apply_adapters(self._base, adapters, lora, self.lora_mode, model_config=self.model_config,
                                mesh=self.mesh, device=self.device)
        self._pending_weights = (params, int(version))
        self._maybe_swap_weights()

    def _laid_out_base(self, params: Any, caller: str) -> Any:
        shapes = jax.tree.map(lambda x: (x.shape, x.dtype), params)
        if shapes != self._param_shapes:
            raise ValueError(f"{caller}: the new parameters differ in structure, shape or dtype from the "
                             "engine's; build a new Engine for a different model")
        return self._layout(params)

    # ------------------------------------------------------------------ scheduling (host)

    def _validate(self, request: Request) -> None:
        sampling, length = request.sampling, len(request.prompt_ids)
        if length == 0:
            raise ValueError(f"request {request.prompt_id!r}: empty prompt")
        if length > self.config.max_prompt_len:
            raise ValueError(f"request {request.prompt_id!r}: prompt of {length} tokens exceeds "
                             f"max_prompt_len={self.config.max_prompt_len}")
        if sampling.max_new_tokens > self.config.max_new_tokens:
            raise ValueError(f"request {request.prompt_id!r}: max_new_tokens={sampling.max_new_tokens} exceeds the "
                             f"engine's max_new_tokens={self.config.max_new_tokens}")
        vocab = self.model_config.vocab_size
        if any(not 0 <= int(t) < vocab for t in request.prompt_ids):
            raise ValueError(f"request {request.prompt_id!r}: prompt token ids must lie in [0, {vocab})")
        if len(self._stop_ids(sampling)) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"request {request.prompt_id!r}: at most {MAX_STOP_TOKEN_IDS} stop token ids (EOS included)")
        if sampling.stop_strings and self.detokenize is None:
            raise ValueError(f"request {request.prompt_id!r}: stop_strings need an Engine built with detokenize=")
        if not 0 <= request.seed < 2**31:
            raise ValueError(f"request {request.prompt_id!r}: seed must lie in [0, 2**31)")
        if request.episode_tokens:
            self._episodes.validate_first_turn(request)
        prompt_key_id(request.prompt_id)  # raises on a bad id

    def _stop_ids(self, sampling: SamplingParams) -> tuple[int, ...]:
        eos = () if sampling.ignore_eos else self.model_config.eos_token_ids
        return tuple(dict.fromkeys((*sampling.stop_token_ids, *eos)))

    def _admit(self) -> None:
        """Move queued samples into free slots while their pages can be reserved; prefill them together."""
        free_slots = [slot for slot, seq in enumerate(self._running) if seq is None]
        admitted: list[tuple[int, _Sequence]] = []
        while self._queue and len(admitted) < len(free_slots):
            seq = self._queue[0]
            budget = seq.request.episode_tokens or len(seq.request.prompt_ids) + seq.request.sampling.max_new_tokens
            pages = self._allocator.allocate(pages_needed(budget, self.config.page_size))
            if pages is None:
                break  # FIFO: the head waits for pages rather than being overtaken and starved
            self._queue.popleft()
            seq.pages, seq.version = pages, self._version
            if seq.request.episode_tokens:
                seq.episode, seq.cache_version = self._episodes.new_handle(), self._version
            admitted.append((free_slots[len(admitted)], seq))
        if admitted:
            self._prefill_group(admitted)

    def _prefill_group(self, admitted: list[tuple[int, _Sequence]]) -> None:
        """Cache every admitted prompt but its last token, once per request; start the slots.

        The first decode step runs each sample's last prompt token and samples its first token
        with the sample's own key. So the samples of one request share one prefill: the first
        sample admitted computes the prompt, its siblings admitted with it copy its pages.
        """
        config = self.config
        owners: dict[int, _Sequence] = {}  # id(request) -> the sample whose pages hold the prompt
        for _, seq in admitted:
            owners.setdefault(id(seq.request), seq)
        prefixes = [seq for seq in owners.values() if len(seq.request.prompt_ids) > 1]
        for start in range(0, len(prefixes), config.prefill_batch):
            self._prefill_prompts(prefixes[start:start + config.prefill_batch])
        if prefixes:
            length = config.bucket_for(max(len(seq.request.prompt_ids) - 1 for seq in prefixes))
            self._copy_prefixes_to_siblings(admitted, owners, pages_needed(length, config.page_size))
        for slot, seq in admitted:
            self._start_slot(slot, seq)

    def _start_slot(self, slot: int, seq: _Sequence) -> None:
        """Decode ``seq`` in ``slot`` from its last prompt token (every earlier one is in its pages)."""
        slots = self._slots
        self._running[slot] = seq
        self._fill_sampling(slots, slot, seq)
        slots.page_table[slot] = 0
        slots.page_table[slot, : len(seq.pages)] = seq.pages
        slots.length[slot] = len(seq.request.prompt_ids) - 1
        slots.last_token[slot] = seq.request.prompt_ids[-1]
        slots.active[slot] = True

    def _prefill_prompts(self, prefixes: list[_Sequence]) -> None:
        """One prefill call: these prompts but their last tokens, left-padded to one bucket, into their pages."""
        config = self.config
        batch = next(b for b in self._prefill_batches if b >= len(prefixes))
        length = config.bucket_for(max(len(seq.request.prompt_ids) - 1 for seq in prefixes))
        tokens = np.zeros((batch, length), np.int32)
        positions = np.full((batch, length), -1, np.int32)
        page_table = np.zeros((batch, config.pages_per_sequence), np.int32)
        for row, seq in enumerate(prefixes):
            prefix = np.asarray(seq.request.prompt_ids[:-1], np.int32)
            tokens[row, length - len(prefix):] = prefix  # left-padded: positions say where each token goes
            positions[row, length - len(prefix):] = np.arange(len(prefix))
            page_table[row, : len(seq.pages)] = seq.pages
        self._cache = self._prefill(self._params, self._cache, tokens, positions, page_table)
        self.stats["prefill_calls"] += 1

    def _copy_prefixes_to_siblings(self, admitted, owners: dict[int, _Sequence], width: int) -> None:
        source = np.zeros((self.config.num_slots, width), np.int32)  # sink -> sink in unused rows
        target = np.zeros_like(source)
        copies = 0
        for row, (_, seq) in enumerate(admitted):
            owner = owners[id(seq.request)]
            pages = pages_needed(len(seq.request.prompt_ids) - 1, self.config.page_size)
            if owner is not seq and pages:
                source[row, :pages], target[row, :pages] = owner.pages[:pages], seq.pages[:pages]
                copies += 1
        if copies:
            self._cache = self._copy_pages(self._cache, source, target)
            self.stats["shared_prefills"] += copies

    def _fill_sampling(self, state: SlotState, row: int, seq: _Sequence) -> None:
        sampling, request = seq.request.sampling, seq.request
        state.seed[row] = request.seed
        state.prompt_key[row] = prompt_key_id(request.prompt_id)
        state.sample_index[row] = seq.sample_index
        state.temperature[row] = sampling.temperature
        state.top_k[row] = sampling.top_k
        state.top_p[row] = sampling.top_p
        state.max_new[row] = sampling.max_new_tokens
        state.generated[row] = 0
        stop_ids = self._stop_ids(sampling)
        state.stop_ids[row] = -1
        state.stop_ids[row, : len(stop_ids)] = stop_ids

    def _decode_chunk(self) -> None:
        slots = self._slots
        mode = max(sampling_mode(seq.request.sampling) for seq in self._running if seq is not None)
        tokens, logprobs, steps, state, self._cache = self._decode(
            self._params, self._cache, self._decode_state(self._pages_this_call()), mode=mode)
        tokens, logprobs, steps = np.asarray(tokens), np.asarray(logprobs), int(steps)
        self.stats["decode_calls"] += 1
        self.stats["decode_steps"] += steps
        for name in ("last_token", "length", "generated"):
            getattr(slots, name)[:] = np.asarray(state[name])
        for slot, seq in enumerate(self._running):
            if seq is not None:
                produced = tokens[slot, :steps]
                count = int((produced >= 0).sum())
                self._record(slot, produced[:count].tolist(), logprobs[slot, :count].tolist())

    def _decode_state(self, width: int) -> dict[str, np.ndarray]:
        state = self._slots.as_dict()
        state["page_table"] = state["page_table"][:, :width]
        return state

    def _pages_this_call(self) -> int:
        """Page-table columns the next decode call can touch, rounded up to a bucket (``_geometric_buckets``).

        Attention then reads the pages in use rather than the longest sequence's worth, which
        matters most early in long generations; the buckets bound the compiled variants.
        """
        longest = int(self._slots.length[self._slots.active].max(initial=0)) + self.config.decode_steps_per_call
        needed = min(pages_needed(longest, self.config.page_size), self.config.pages_per_sequence)
        return next(w for w in self._window_widths if w >= needed)

    def _record(self, slot: int, tokens: list[int], logprobs: list[float]) -> None:
        """Append new tokens to the slot's sequence and retire it if a stop rule fired."""
        seq, sampling = self._running[slot], self._running[slot].request.sampling
        seq.tokens.extend(tokens)
        seq.logprobs.extend(logprobs)
        self.stats["tokens"] += len(tokens)
        stop_ids = set(self._stop_ids(sampling))
        for i, token in enumerate(seq.tokens[len(seq.tokens) - len(tokens):]):
            if token in stop_ids:
                del seq.tokens[len(seq.tokens) - len(tokens) + i + 1:]
                del seq.logprobs[len(seq.tokens):]
                return self._retire(slot, "stop")
        if sampling.stop_strings and self._cut_at_stop_string(seq):
            return self._retire(slot, "stop")
        if len(seq.tokens) >= sampling.max_new_tokens:
            return self._retire(slot, "length")

    def _cut_at_stop_string(self, seq: _Sequence) -> bool:
        """Cut ``seq`` right after the first token whose text completes a stop string; True if cut."""
        stops = seq.request.sampling.stop_strings
        if not any(s in self.detokenize(seq.tokens) for s in stops):
            seq.text_checked_upto = len(seq.tokens)
            return False
        # A stop string found now ends somewhere in the tokens added since the last check.
        for end in range(max(seq.text_checked_upto, 1), len(seq.tokens) + 1):
            if any(s in self.detokenize(seq.tokens[:end]) for s in stops):
                del seq.tokens[end:]
                del seq.logprobs[end:]
                return True
        return False  # unreachable: the full text held a stop string

    def _retire(self, slot: int, reason: FinishReason) -> None:
        seq = self._running[slot]
        self._running[slot] = None
        self._slots.active[slot] = False
        self._slots.page_table[slot] = 0
        if seq.episode is not None and reason != "abort":
            self._episodes.park(seq)  # its pages wait for the next turn or end_episode
        else:
            self._allocator.free(seq.pages)
            seq.pages = []
        self._finish(seq, reason)

    def _finish(self, seq: _Sequence, reason: FinishReason) -> None:
        seq.finish_reason = reason
        self._finished.append(seq)

    def _drain_finished(self) -> list[tuple[int, Completion]]:
        done, self._finished = self._finished, []
        return [(seq.order, Completion(
            prompt_id=seq.request.prompt_id, sample_index=seq.sample_index, seed=seq.request.seed,
            prompt_ids=tuple(int(t) for t in seq.request.prompt_ids), completion_ids=tuple(seq.tokens),
            logprobs=tuple(seq.logprobs), finish_reason=seq.finish_reason, weight_version=seq.version,
            episode=seq.episode)) for seq in done]

    def _maybe_swap_weights(self) -> None:
        if self._pending_weights is None or any(seq is not None for seq in self._running):
            return
        (self._params, self._version), self._pending_weights = self._pending_weights, None
        self.stats["weight_swaps"] += 1
        logger.info("engine now on weight version %d", self._version)

    def _layout(self, params):
        """The decoding layout on the engine's device(s): programs run where their committed inputs
        (weights, cache) are."""
        if self.mesh is None:
            return programs.decoding_layout(params if self.device is None else jax.device_put(params, self.device))
        params = jax.device_put(params, stacked_param_shardings(self.model_config, params, self.mesh))
        if self._relayout is None:
            unstacked = jax.eval_shape(unstack_layers, params)
            self._relayout = programs.tensor_parallel_layout(
                decoding_param_shardings(self.model_config, unstacked, self.mesh))
        return self._relayout(params)

    def _allocate_cache(self) -> KVCache:
        """Allocated in place, on its device(s): a TPU cache may not fit twice on one chip."""
        config, model = self.config, self.model_config
        dtype = jnp.bfloat16 if config.cache_dtype == "bfloat16" else jnp.float32
        allocate = functools.partial(init_kv_cache, model.num_layers, config.num_pages, config.page_size,
                                     model.num_kv_heads, model.head_dim, dtype)
        if self.mesh is None:
            with jax.default_device(self.device):
                cache = allocate()
            # Committed where it lies (no copy), as every program's output cache is: an uncommitted first
            # cache made warm_up()'s first prefill another executable, so the first real call compiled.
            return jax.tree.map(lambda x: jax.device_put(x, x.sharding), cache)
        pool = kv_pool_sharding(kv_pool_shape(config.num_pages, config.page_size, model.num_kv_heads,
                                              model.head_dim), self.mesh)
        pools = (pool,) * model.num_layers
        return jax.jit(allocate, out_shardings=KVCache(pools, pools))()

    @staticmethod
    def resolve_lora_mode(mode: str, platform: str) -> str:
        """``lora_mode`` "auto": the mode measured faster (``benchmarks/adapter_serving.py``, docs/lora.md)."""
        if mode == "auto":
            return MEASURED_FASTER_LORA_MODE.get(platform, "merged")
        return mode

    @staticmethod
    def resolve_attention(impl: str, platform: str) -> str:
        if impl == "auto":
            return "pallas" if platform in ("tpu", "gpu") else "window"
        return impl
