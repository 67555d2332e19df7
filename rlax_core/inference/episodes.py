"""The engine's side of multi-turn episodes: sequences that keep their pages between turns.

    first = engine.generate([Request(prompt_ids, sampling, "ex-3", seed=7, episode_tokens=1024)])[0]
    engine.continue_episode(first.episode, observation_ids, sampling)   # queue turn 2
    ... engine.step() ... -> the turn's Completion: prompt_ids = the whole history, completion_ids = the turn
    engine.end_episode(first.episode)                                     # free its pages

Pages. A turn takes pages by the engine's admission rule (``pages``): under ``reserve`` a first
turn reserves the episode's whole token budget (``episode_tokens``), so a continued turn needs no
allocation; under ``on_demand`` a continued turn takes pages for its observation and one decode
call's look-ahead, and grows like any sequence. A parked episode keeps its pages (the samples of
one first turn share their prompt's full pages). When nothing runs and the head of a queue cannot
get its pages, the engine evicts the pages of an episode waiting between turns (``evict``): its next turn then
recomputes its history, so episodes that hold pages cannot deadlock requests that want them.

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
from typing import Sequence

from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.continuation import Extend, feed_uncached
from rlax_core.inference.pages import PagePool
from rlax_core.inference.sequences import Request, SequenceState


class EpisodeTurns:
    """Parked and queued turns of one engine's episodes.

    It holds the turns between their engine calls and is handed what it needs of the engine: the
    engine's shapes (``config``), the page pool (an ended episode gives its pages back there) and
    ``extend``, which computes a continued turn's new tokens into its pages. The engine owns the
    slots and the output order: ``admit`` returns the turns to start, and a continued turn is
    queued at the position in the output the engine gives it.
    """

    def __init__(self, config: EngineConfig, vocab_size: int, pages: PagePool, extend: Extend,
                 stop_strings_allowed: bool):
        self._config, self._vocab_size, self._pages, self._extend = config, vocab_size, pages, extend
        self._stop_strings_allowed = stop_strings_allowed  # the engine can detokenize
        self._parked: dict[int, SequenceState] = {}
        self._queued: list[SequenceState] = []  # FIFO
        self._next_handle = 0

    def queued(self) -> bool:
        return bool(self._queued)

    def parked(self) -> int:
        return len(self._parked)

    def new_handle(self) -> int:
        self._next_handle += 1
        return self._next_handle - 1

    def validate_first_turn(self, request: Request) -> None:
        limit = self._config.max_seq_len
        if not len(request.prompt_ids) + request.sampling.max_new_tokens <= request.episode_tokens <= limit:
            raise ValueError(f"request {request.prompt_id!r}: episode_tokens={request.episode_tokens} must hold the "
                             f"prompt and its first turn ({len(request.prompt_ids)} + "
                             f"{request.sampling.max_new_tokens}) and at most the engine's max_seq_len={limit}")

    def park(self, seq: SequenceState) -> None:
        self._parked[seq.episode] = seq

    def continue_(self, episode: int, observation_ids: Sequence[int], sampling: SamplingParams, order: int) -> None:
        """Queue the next turn of ``episode``, at ``order`` in the engine's output."""
        seq = self._parked.get(episode)
        if seq is None:
            raise KeyError(f"episode {episode} has no finished turn waiting (ended or still running)")
        request = seq.request
        history = (*request.prompt_ids, *seq.tokens, *(int(t) for t in observation_ids))
        if any(not 0 <= t < self._vocab_size for t in observation_ids):
            raise ValueError(f"episode {episode}: observation token ids must lie in [0, {self._vocab_size})")
        if sampling.samples_per_prompt != 1 or sampling.stop_strings and not self._stop_strings_allowed:
            raise ValueError(f"episode {episode}: a continued turn samples once (samples_per_prompt=1); "
                             "stop strings need detokenize=")
        if len(history) + sampling.max_new_tokens > request.episode_tokens:
            raise ValueError(f"episode {episode}: {len(history)} tokens of history + {sampling.max_new_tokens} new "
                             f"exceed its episode_tokens={request.episode_tokens}")
        if sampling.max_new_tokens > self._config.max_new_tokens:
            raise ValueError(f"episode {episode}: max_new_tokens={sampling.max_new_tokens} exceeds the engine's "
                             f"{self._config.max_new_tokens}")
        del self._parked[episode]
        self._queued.append(dataclasses.replace(
            seq, order=order, request=dataclasses.replace(request, prompt_ids=history, sampling=sampling),
            tokens=[], logprobs=[], finish_reason=None, text_checked_upto=0, version=-1, version_starts=[],
            # Everything but the last sampled token is in the pages (the decode loop feeds a token one
            # step after sampling it).
            cached=len(request.prompt_ids) + len(seq.tokens) - 1, key_offset=seq.key_offset + len(seq.tokens)))

    def end(self, episode: int) -> None:
        seq = self._parked.pop(episode, None)
        if seq is None:
            raise KeyError(f"episode {episode} has no finished turn waiting (ended or still running)")
        self._pages.release(seq)

    def admit(self, free_slots: list[int], version: int) -> list[tuple[int, SequenceState]]:
        """Queued turns for ``free_slots`` whose pages the pool gives (FIFO), their uncached tokens
        computed into their pages with the weights of ``version``: the engine decodes each from its
        last token."""
        admitted: list[tuple[int, SequenceState]] = []
        while self._queued and len(admitted) < len(free_slots):
            seq = self._queued[0]
            if seq.cache_version != version and seq.pages:
                # Cached by other weights: recompute the history with the new ones, into pages of its
                # own (its first pages may be shared with its siblings' episodes).
                self._pages.release(seq)
            if not seq.pages:
                seq.cached = 0
            if not self._pages.admit(seq, seq.length):
                break
            self._queued.pop(0)
            seq.cache_version = version
            seq.sample_under(version)
            admitted.append((free_slots[len(admitted)], seq))
        feed_uncached([seq for _, seq in admitted], self._config, self._extend)
        return admitted

    def evict(self) -> bool:
        """Give back the pages of one episode that is not running: the most recently parked holding
        any, else the last queued turn holding any. Its next turn recomputes its history. False
        when none holds pages."""
        for seq in [*reversed(self._parked.values()), *reversed(self._queued)]:
            if seq.pages:
                self._pages.release(seq)
                seq.cache_version = -1
                return True
        return False
