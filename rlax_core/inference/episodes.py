"""The engine's side of multi-turn episodes: sequences that keep their pages between turns.

    first = engine.generate([Request(prompt_ids, sampling, "ex-3", seed=7, episode_tokens=1024)])[0]
    engine.continue_episode(first.episode, observation_ids, sampling)   # queue turn 2
    ... engine.step() ... -> the turn's Completion: prompt_ids = the whole history, completion_ids = the turn
    engine.end_episode(first.episode)                                     # free its pages

Pages. A first turn reserves pages for the episode's whole token budget (``episode_tokens``), the
admission rule of every sequence: a running episode never runs out of cache, so a continued turn
needs no allocation and cannot wait behind a new request for pages (no deadlock between episodes
that hold pages and requests that want them).

Slots. A finished turn leaves its slot at once and *parks*: it holds pages, not a decode slot. While
its caller runs a tool, other sequences decode in that slot; the continued turn takes whichever slot
is free next, ahead of queued new requests.

Prefix reuse. The cache holds every token of the history but the last sampled one; ``continue_``
appends the observation and ``continuation.extend`` computes only the tokens not cached yet. If the
weights changed since the cache was computed, the history is computed again from position 0 with the
new weights, so a turn's log-probs are one version's, equal to a full forward of the transcript.

Keys. Turn k's token i is sampled with token index (policy tokens of turns < k) + i: replaying an
episode from its seed with the same observations gives the same tokens, and no two turns share keys.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from rlax_core.inference.config import SamplingParams
from rlax_core.inference.continuation import extend


class EpisodeTurns:
    """Parked and queued turns of one engine's episodes (the engine owns the slots and the pages).

    It works on the engine's host-side state (``Engine``, its ``_Sequence`` records), which it
    receives rather than imports: the engine imports this module.
    """

    def __init__(self, engine: Any):
        self._engine = engine
        self._parked: dict[int, Any] = {}
        self._queued: list[Any] = []  # FIFO
        self._next_handle = 0

    def queued(self) -> bool:
        return bool(self._queued)

    def parked(self) -> int:
        return len(self._parked)

    def new_handle(self) -> int:
        self._next_handle += 1
        return self._next_handle - 1

    def validate_first_turn(self, request: Any) -> None:
        limit = self._engine.config.max_seq_len
        if not len(request.prompt_ids) + request.sampling.max_new_tokens <= request.episode_tokens <= limit:
            raise ValueError(f"request {request.prompt_id!r}: episode_tokens={request.episode_tokens} must hold the "
                             f"prompt and its first turn ({len(request.prompt_ids)} + "
                             f"{request.sampling.max_new_tokens}) and at most the engine's max_seq_len={limit}")

    def park(self, seq: Any) -> None:
        self._parked[seq.episode] = seq

    def continue_(self, episode: int, observation_ids: Sequence[int], sampling: SamplingParams) -> None:
        seq = self._parked.get(episode)
        if seq is None:
            raise KeyError(f"episode {episode} has no finished turn waiting (ended, aborted or still running)")
        request = seq.request
        history = (*request.prompt_ids, *seq.tokens, *(int(t) for t in observation_ids))
        vocab = self._engine.model_config.vocab_size
        if any(not 0 <= t < vocab for t in observation_ids):
            raise ValueError(f"episode {episode}: observation token ids must lie in [0, {vocab})")
        if sampling.samples_per_prompt != 1 or sampling.stop_strings and self._engine.detokenize is None:
            raise ValueError(f"episode {episode}: a continued turn samples once (samples_per_prompt=1); "
                             "stop strings need detokenize=")
        if len(history) + sampling.max_new_tokens > request.episode_tokens:
            raise ValueError(f"episode {episode}: {len(history)} tokens of history + {sampling.max_new_tokens} new "
                             f"exceed its episode_tokens={request.episode_tokens}")
        if sampling.max_new_tokens > self._engine.config.max_new_tokens:
            raise ValueError(f"episode {episode}: max_new_tokens={sampling.max_new_tokens} exceeds the engine's "
                             f"{self._engine.config.max_new_tokens}")
        del self._parked[episode]
        engine = self._engine
        turn = dataclasses.replace(
            seq, order=engine._next_order, request=dataclasses.replace(request, prompt_ids=history, sampling=sampling),
            tokens=[], logprobs=[], finish_reason=None, text_checked_upto=0,
            # Everything but the last sampled token is in the pages (the decode loop feeds a token one
            # step after sampling it).
            cached=len(request.prompt_ids) + len(seq.tokens) - 1, key_offset=seq.key_offset + len(seq.tokens))
        engine._next_order += 1
        self._queued.append(turn)

    def end(self, episode: int) -> None:
        seq = self._parked.pop(episode, None)
        if seq is None:
            raise KeyError(f"episode {episode} has no finished turn waiting (ended, aborted or still running)")
        self._engine._allocator.free(seq.pages)
        seq.pages = []

    def abort(self, prompt_id) -> None:
        """Free the parked and queued turns of ``prompt_id``; queued ones finish as aborted, empty."""
        for episode, seq in list(self._parked.items()):
            if seq.request.prompt_id == prompt_id:
                self.end(episode)
        for seq in [s for s in self._queued if s.request.prompt_id == prompt_id]:
            self._queued.remove(seq)
            self._engine._allocator.free(seq.pages)
            seq.pages, seq.version = [], self._engine.version
            self._engine._finish(seq, "abort")

    def admit(self, free_slots: list[int]) -> None:
        """Start queued turns in free slots: compute their uncached tokens, then decode from the last one."""
        engine = self._engine
        admitted = [(slot, self._queued.pop(0)) for slot in free_slots[:len(self._queued)]]
        if not admitted:
            return
        for _, seq in admitted:
            if seq.cache_version != engine.version:
                seq.cached = 0  # cached by other weights: recompute the history with the new ones
            seq.version = seq.cache_version = engine.version
        self._extend_all([seq for _, seq in admitted])
        for slot, seq in admitted:
            engine._start_slot(slot, seq)
            engine._slots.generated[slot] = seq.key_offset
            engine._slots.max_new[slot] = seq.key_offset + seq.request.sampling.max_new_tokens

    def warm_up(self) -> None:
        """Compile the continuation for every (batch bucket, length bucket), on rows of padding only
        (written to the sink page)."""
        engine = self._engine
        for batch in engine._prefill_batches:
            for length in engine.config.prefill_buckets:
                self._extend(np.zeros((batch, length), np.int32), np.full((batch, length), -1, np.int32),
                             np.zeros((batch, engine.config.pages_per_sequence), np.int32))

    def _extend(self, tokens: np.ndarray, positions: np.ndarray, page_table: np.ndarray) -> None:
        engine = self._engine
        engine._cache = extend(engine._params, engine._cache, tokens, positions, page_table,
                               model_config=engine.model_config, mesh=engine.mesh)

    def _extend_all(self, turns: list[Any]) -> None:
        """Feed each turn's tokens [cached, last) into its pages, in calls of at most one prefill
        batch and the largest prefill bucket (a long history, after a weight swap, takes several)."""
        engine = self._engine
        config = engine.config
        chunk = config.prefill_buckets[-1]
        pending = {id(seq): seq.cached for seq in turns}
        while True:
            rows = [seq for seq in turns if pending[id(seq)] < len(seq.request.prompt_ids) - 1]
            if not rows:
                return
            for start in range(0, len(rows), config.prefill_batch):
                group = rows[start:start + config.prefill_batch]
                batch = next(b for b in engine._prefill_batches if b >= len(group))
                spans = [(pending[id(seq)], min(pending[id(seq)] + chunk, len(seq.request.prompt_ids) - 1))
                         for seq in group]
                length = config.bucket_for(max(end - begin for begin, end in spans))
                tokens = np.zeros((batch, length), np.int32)
                positions = np.full((batch, length), -1, np.int32)
                page_table = np.zeros((batch, config.pages_per_sequence), np.int32)
                for row, (seq, (begin, end)) in enumerate(zip(group, spans)):
                    tokens[row, :end - begin] = seq.request.prompt_ids[begin:end]
                    positions[row, :end - begin] = np.arange(begin, end)
                    page_table[row, :len(seq.pages)] = seq.pages
                    pending[id(seq)] = end
                self._extend(tokens, positions, page_table)
                engine.stats["extend_calls"] = engine.stats.get("extend_calls", 0) + 1
                engine.stats["extended_tokens"] = engine.stats.get("extended_tokens", 0) + sum(e - b for b, e in spans)
