"""What goes into the engine and what comes out, and its host-side record of each sample in between.

A ``Request`` is one prompt to sample ``samples_per_prompt`` times; each sample becomes one
``SequenceState`` from admission to retirement, and leaves as one ``Completion``. The record is
shared by the parts of the engine's host side: the page pool (``pages``) sets its pages, the decode
batch (``batch``) its tokens, the episode turns (``episodes``) its cache position.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Sequence

import numpy as np

from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.sampling import SamplingMode, prompt_key_id

FinishReason = Literal["stop", "length"]


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

    @property
    def budget(self) -> int:
        """Tokens a sample's pages must hold: the whole episode's, else the prompt and its completion."""
        return self.episode_tokens or len(self.prompt_ids) + self.sampling.max_new_tokens


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
    weight_version: int  # the version its first token was sampled under (the oldest of its tokens)
    episode: int | None = None  # an episode's handle for ``continue_episode`` / ``end_episode``
    # The version each completion token was sampled under: a weight swap that does not drain
    # (``EngineConfig.on_new_version``) moves the sequences running through it to the new version.
    token_versions: tuple[int, ...] = ()
    # A mixture of experts: the experts each position of prompt + completion ran in each sparse layer,
    # [tokens, moe_layers, k] uint8 (uint16 beyond 256 experts), what the trainer replays
    # (``algorithm.router_replay``). The last token was never fed (nothing reads its routing): zeros.
    # An episode's turn: its whole history's (earlier turns and observations). None for a dense model.
    routed_experts: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)


@dataclasses.dataclass
class SequenceState:
    """Host-side bookkeeping of one sample from admission to retirement."""

    order: int  # position in the engine's output (``Engine.generate`` sorts by it)
    request: Request
    sample_index: int
    pages: list[int] = dataclasses.field(default_factory=list)  # set by the page pool alone
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    version: int = -1
    finish_reason: FinishReason | None = None
    text_checked_upto: int = 0  # tokens already searched for stop strings
    episode: int | None = None  # set for the turns of an episode (``episode_tokens``)
    cached: int = 0  # leading prompt tokens already in its pages (a continued episode)
    key_offset: int = 0  # policy tokens of the episode's earlier turns: the keys' token index starts there
    cache_version: int = -1  # the weight version that computed its cached tokens
    # (token index, version) where each version of its tokens starts, in order.
    version_starts: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    # A mixture of experts: per position of its budget, the experts its last computation ran
    # [budget, moe_layers, k]: a recomputation (preemption, a recomputing swap) overwrites the first
    # (docs/training.md, router replay). An episode's turns share one record.
    routed_experts: np.ndarray | None = None
    # A preempted sequence swapped out (``preemption``): host copies of the pages of its cached tokens.
    swapped: Any = None

    def record_routing(self, start: int, expert_ids: np.ndarray) -> None:
        """The routed ids [tokens, moe_layers, k] of positions ``start ...`` (no-op without a record)."""
        if self.routed_experts is not None:
            self.routed_experts[start:start + len(expert_ids)] = expert_ids

    @property
    def length(self) -> int:
        """Tokens of its prompt and completion so far: the decode loop feeds the last and caches the rest."""
        return len(self.request.prompt_ids) + len(self.tokens)

    def last_token(self) -> int:
        return int(self.tokens[-1] if self.tokens else self.request.prompt_ids[-1])

    def fed_tokens(self, begin: int, end: int) -> list[int]:
        """Tokens ``begin:end`` of its prompt followed by its completion so far."""
        prompt = self.request.prompt_ids
        return [*prompt[begin:end], *self.tokens[max(begin - len(prompt), 0):max(end - len(prompt), 0)]]

    def sample_under(self, version: int) -> None:
        """Its tokens from now on come from weight ``version``."""
        if not self.version_starts or self.version_starts[-1][1] != version:
            if self.version_starts and self.version_starts[-1][0] == len(self.tokens):
                self.version_starts.pop()  # no token came from the version before
            self.version_starts.append((len(self.tokens), version))
        if self.version < 0:
            self.version = version

    def token_versions(self) -> tuple[int, ...]:
        ends = [start for start, _ in self.version_starts[1:]] + [len(self.tokens)]
        return tuple(version for (start, version), end in zip(self.version_starts, ends)
                     for _ in range(max(0, min(end, len(self.tokens)) - start)))

    def completion(self) -> Completion:
        request = self.request
        versions = self.token_versions()
        return Completion(prompt_id=request.prompt_id, sample_index=self.sample_index, seed=request.seed,
                          prompt_ids=tuple(int(t) for t in request.prompt_ids), completion_ids=tuple(self.tokens),
                          logprobs=tuple(self.logprobs), finish_reason=self.finish_reason,
                          weight_version=versions[0] if versions else self.version, episode=self.episode,
                          token_versions=versions,
                          routed_experts=None if self.routed_experts is None else self.routed_experts[:self.length].copy())


def check_request(request: Request, config: EngineConfig, vocab_size: int) -> None:
    """Raise with the reason where ``request`` does not fit an engine of ``config`` and its model's vocabulary
    (the stop rules and an episode's tokens are the decode batch's and the episodes' to check)."""
    sampling, length, name = request.sampling, len(request.prompt_ids), request.prompt_id
    if length == 0:
        raise ValueError(f"request {name!r}: empty prompt")
    if length > config.max_prompt_len:
        raise ValueError(f"request {name!r}: prompt of {length} tokens exceeds max_prompt_len={config.max_prompt_len}")
    if sampling.max_new_tokens > config.max_new_tokens:
        raise ValueError(f"request {name!r}: max_new_tokens={sampling.max_new_tokens} exceeds the "
                         f"engine's max_new_tokens={config.max_new_tokens}")
    if any(not 0 <= int(t) < vocab_size for t in request.prompt_ids):
        raise ValueError(f"request {name!r}: prompt token ids must lie in [0, {vocab_size})")
    if not 0 <= request.seed < 2**31:
        raise ValueError(f"request {name!r}: seed must lie in [0, 2**31)")
    prompt_key_id(name)  # raises on a bad id


def sampling_mode(sampling: SamplingParams) -> SamplingMode:
    """The compiled sampling program a request runs under (what ``warm_up(modes=...)`` compiles)."""
    if sampling.greedy:
        return SamplingMode.GREEDY
    return SamplingMode.FILTERED if sampling.filtered else SamplingMode.TEMPERATURE
