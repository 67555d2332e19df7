"""The decode batch: which sequence runs in which slot, the arrays a decode call reads, and the stop rules.

A decode call (``programs.decode``) runs every slot for up to ``decode_steps_per_call`` tokens on the
device. Before it, ``inputs`` hands it the slots' state as numpy arrays; after it, ``take`` appends
each slot's new tokens to its sequence and says which sequences a stop rule ended: a stop token
(kept as the last token, so its log-prob is recorded), a stop string (the completion cut right
after the token that completed it) or the length budget.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rlax_core.inference.config import EngineConfig, SamplingParams
from rlax_core.inference.pages import pages_needed
from rlax_core.inference.sampling import SamplingMode, prompt_key_id
from rlax_core.inference.sequences import FinishReason, SequenceState, sampling_mode

MAX_STOP_TOKEN_IDS = 8  # stop ids per sequence checked on the device (EOS ids included)


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


class DecodeBatch:
    """The engine's slots. ``eos_token_ids`` end a sample unless its sampling ignores EOS;
    ``detokenize`` (ids -> text) is needed only for stop strings."""

    def __init__(self, config: EngineConfig, eos_token_ids: Sequence[int],
                 detokenize: Callable[[Sequence[int]], str] | None):
        self.config = config
        self._eos = tuple(eos_token_ids)
        self._detokenize = detokenize
        self.state = SlotState(config.num_slots, config.pages_per_sequence)
        self._running: list[SequenceState | None] = [None] * config.num_slots

    def free_slots(self) -> list[int]:
        return [slot for slot, seq in enumerate(self._running) if seq is None]

    def active(self) -> int:
        """Slots decoding a sequence."""
        return sum(seq is not None for seq in self._running)

    def stop_ids(self, sampling: SamplingParams) -> tuple[int, ...]:
        eos = () if sampling.ignore_eos else self._eos
        return tuple(dict.fromkeys((*sampling.stop_token_ids, *eos)))

    def start(self, slot: int, seq: SequenceState) -> None:
        """Decode ``seq`` in ``slot`` from its last token so far (every earlier one is in its pages):
        its last prompt token, or, resuming after a preemption, its last sampled one.

        Its keys' token index counts on from the tokens it has (``sampling``), and an episode's later
        turn's from its earlier turns' tokens too (``key_offset``), its length budget with it."""
        state, request, sampling = self.state, seq.request, seq.request.sampling
        self._running[slot] = seq
        state.seed[slot] = request.seed
        state.prompt_key[slot] = prompt_key_id(request.prompt_id)
        state.sample_index[slot] = seq.sample_index
        state.temperature[slot] = sampling.temperature
        state.top_k[slot] = sampling.top_k
        state.top_p[slot] = sampling.top_p
        state.generated[slot] = seq.key_offset + len(seq.tokens)
        state.max_new[slot] = seq.key_offset + sampling.max_new_tokens
        stop_ids = self.stop_ids(sampling)
        state.stop_ids[slot] = -1
        state.stop_ids[slot, : len(stop_ids)] = stop_ids
        state.page_table[slot] = 0
        state.page_table[slot, : len(seq.pages)] = seq.pages
        state.length[slot] = seq.length - 1
        state.last_token[slot] = seq.last_token()
        state.active[slot] = True

    def running(self) -> list[tuple[int, SequenceState]]:
        """(slot, sequence) of every busy slot."""
        return [(slot, seq) for slot, seq in enumerate(self._running) if seq is not None]

    def sequence(self, slot: int) -> SequenceState | None:
        return self._running[slot]

    def set_pages(self, slot: int, seq: SequenceState) -> None:
        """Point ``slot``'s page table at the pages ``seq`` holds now (it grew)."""
        self.state.page_table[slot, : len(seq.pages)] = seq.pages

    def vacate(self, slot: int) -> SequenceState:
        """Free ``slot``; its sequence (which keeps its pages) is returned."""
        seq, self._running[slot] = self._running[slot], None
        self.state.active[slot] = False
        self.state.page_table[slot] = 0
        return seq

    def mode(self) -> SamplingMode:
        """The most general sampling program any running sequence needs."""
        return max(sampling_mode(seq.request.sampling) for seq in self._running if seq is not None)

    def inputs(self, width: int) -> dict[str, np.ndarray]:
        """The decode program's slot state, the page table cut to ``width`` columns."""
        state = self.state.as_dict()
        state["page_table"] = state["page_table"][:, :width]
        return state

    def pages_touched(self) -> int:
        """Page-table columns the next decode call can touch: the longest running sequence after the call."""
        longest = int(self.state.length[self.state.active].max(initial=0)) + self.config.decode_steps_per_call
        return min(pages_needed(longest, self.config.page_size), self.config.pages_per_sequence)

    def take(self, tokens: np.ndarray, logprobs: np.ndarray, steps: int, state: dict,
             routed: np.ndarray | None = None) -> tuple[list[tuple[int, FinishReason]], int]:
        """Read a decode call's results back: the slots whose sequence a stop rule ended, with the
        reason, and how many tokens the call sampled. ``routed`` [slots, chunk, moe_layers, k]: the
        experts of the tokens each step fed (a mixture of experts), recorded at their positions."""
        for name in ("last_token", "length", "generated"):
            getattr(self.state, name)[:] = np.asarray(state[name])
        ended, sampled = [], 0
        for slot, seq in enumerate(self._running):
            if seq is not None:
                produced = tokens[slot, :steps]
                count = int((produced >= 0).sum())
                sampled += count
                if routed is not None:  # step j fed the token at position length - 1 + j
                    seq.record_routing(seq.length - 1, routed[slot, :count])
                reason = self._record(seq, produced[:count].tolist(), logprobs[slot, :count].tolist())
                if reason is not None:
                    ended.append((slot, reason))
        return ended, sampled

    def _record(self, seq: SequenceState, tokens: list[int], logprobs: list[float]) -> FinishReason | None:
        """Append new tokens to ``seq``; the reason a stop rule ended it, if one did."""
        sampling = seq.request.sampling
        seq.tokens.extend(tokens)
        seq.logprobs.extend(logprobs)
        stop_ids = set(self.stop_ids(sampling))
        for i, token in enumerate(seq.tokens[len(seq.tokens) - len(tokens):]):
            if token in stop_ids:
                del seq.tokens[len(seq.tokens) - len(tokens) + i + 1:]
                del seq.logprobs[len(seq.tokens):]
                return "stop"
        if sampling.stop_strings and self._cut_at_stop_string(seq):
            return "stop"
        if len(seq.tokens) >= sampling.max_new_tokens:
            return "length"
        return None

    def _cut_at_stop_string(self, seq: SequenceState) -> bool:
        """Cut ``seq`` right after the first token whose text completes a stop string; True if cut."""
        stops = seq.request.sampling.stop_strings
        if not any(s in self._detokenize(seq.tokens) for s in stops):
            seq.text_checked_upto = len(seq.tokens)
            return False
        # A stop string found now ends somewhere in the tokens added since the last check.
        for end in range(max(seq.text_checked_upto, 1), len(seq.tokens) + 1):
            if any(s in self._detokenize(seq.tokens[:end]) for s in stops):
                del seq.tokens[end:]
                del seq.logprobs[end:]
                return True
        return False  # unreachable: the full text held a stop string
