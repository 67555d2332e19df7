"""Rejection-sampling data: a prompt's verified samples -> supervised targets and preference pairs.

The difficulty filter samples each prompt ``k`` times and verifies every sample; this module keeps
what it verified instead of throwing it away (rejection-sampling fine-tuning, expert iteration,
STaR; with a teacher as the generator, distillation data):

* **SFT rows** (``SFT_EXAMPLE_SCHEMA``): a prompt's verified samples, deduplicated by normalised text
  (``records.normalize_text``: NFKC, case, white space), ordered ``shortest`` first (tokens, then
  characters, then sample index) or ``random`` (a shuffle seeded by ``seed`` and the example's id, so
  the same prompt gets the same choice on any worker, in any order), at most ``max_per_prompt``.
* **Preference pairs** (``PREFERENCE_PAIR_SCHEMA``): a verified sample (chosen) against a failed one
  (rejected) of the same prompt, at most ``pairs_per_prompt``; none when every sample passed or every
  one failed. Both sides are deduplicated and ordered by the same rule, and the pairs walk the
  diagonals of chosen x rejected, so that the first pairs use every distinct sample once before
  any is used twice.

Each row records the prompt's pass rate over all ``k`` samples (duplicates count: it is the rate the
filter computes) and the generator that wrote the completion. A row's ``prompt`` is the text the
generator read in its task's format (``rlax_core.tasks.prompts``) before any chat template;
``meta.chat`` says whether that task sends it as a user turn to a tokenizer with a chat template.
Pure functions: the Beam shell is ``transforms/rejection_sampling.py``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
from typing import Any, Literal, Mapping, Sequence

from rlax_core.config import require
from rlax_core.data.records import normalize_text

SELECTION_ORDERS = ("shortest", "random")
UNSOLVED, SKIPPED = "unsolved", "skipped"  # dead-letter reasons: no verified sample; no sample at all


@dataclasses.dataclass(frozen=True)
class SampleSelection:
    """Which samples of a prompt become data (keys of the ``rft:`` config section)."""

    max_per_prompt: int = 4  # SFT rows per prompt at most (0: pairs only)
    selection: Literal["shortest", "random"] = "shortest"
    seed: int = 0  # the ``random`` order's seed (with the example's id)
    pairs_per_prompt: int = 0  # preference pairs per prompt at most (0: none)

    def __post_init__(self):
        require(self.max_per_prompt >= 0, "max_per_prompt", f"an integer >= 0, got {self.max_per_prompt}")
        require(self.pairs_per_prompt >= 0, "pairs_per_prompt", f"an integer >= 0, got {self.pairs_per_prompt}")
        require(self.max_per_prompt + self.pairs_per_prompt > 0, "max_per_prompt",
                "max_per_prompt and pairs_per_prompt are both 0: the job would keep nothing")
        require(self.selection in SELECTION_ORDERS, "selection", f"one of {', '.join(SELECTION_ORDERS)}")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One verified sample of a prompt, as the filter's verdicts describe it."""

    index: int  # the sample's index among the prompt's k (its seed's position)
    text: str
    tokens: int
    finish_reason: str
    correct: bool
    answer: str | None = None  # the verifier's canonical answer (math), else None

    @property
    def key(self) -> str:
        return normalize_text(self.text)

    def summary(self) -> dict[str, Any]:
        return {"sample_index": self.index, "tokens": self.tokens, "finish_reason": self.finish_reason,
                "correct": self.correct, "answer": self.answer}


def samples_of(result: Mapping[str, Any]) -> list[Sample]:
    """The samples of one verified result of ``transforms.inference.SampleAndVerify``."""
    answers = result.get("answers") or [None] * len(result["texts"])
    return [Sample(i, text, int(tokens), finish, bool(correct), answer) for i, (text, tokens, finish, correct, answer)
            in enumerate(zip(result["texts"], result["lengths"], result["finish_reasons"], result["correct"], answers))]


def pass_rate(samples: Sequence[Sample]) -> float:
    """Verified samples over all of them (the filter's pass rate); a prompt without samples has none."""
    if not samples:
        raise ValueError("a pass rate needs at least one sample")
    return sum(s.correct for s in samples) / len(samples)


def ordered(samples: Sequence[Sample], selection: SampleSelection, example_id: str) -> list[Sample]:
    """``samples`` in the selection's order: shortest first, or a shuffle seeded by (seed, example id)."""
    if selection.selection == "shortest":
        return sorted(samples, key=lambda s: (s.tokens, len(s.text), s.index))
    shuffled = sorted(samples, key=lambda s: s.index)  # the shuffle must not depend on the order given
    # A string seed goes through SHA-512: the same on every worker, whatever PYTHONHASHSEED says.
    random.Random(f"{selection.seed}\x00{example_id}").shuffle(shuffled)
    return shuffled


def distinct(samples: Sequence[Sample]) -> tuple[list[Sample], int]:
    """The first sample of each normalised text, in the order given, and how many were dropped.
    An empty completion (nothing but white space) is dropped too: there is nothing in it to learn."""
    seen, kept = set(), []
    for sample in samples:
        if sample.key and sample.key not in seen:
            seen.add(sample.key)
            kept.append(sample)
    return kept, len(samples) - len(kept)


def select_verified(samples: Sequence[Sample], selection: SampleSelection, example_id: str) -> list[Sample]:
    """The verified samples that become SFT rows: distinct, in the selection's order, at most N."""
    verified, _ = distinct(ordered([s for s in samples if s.correct], selection, example_id))
    return verified[:selection.max_per_prompt]


def preference_pairs(samples: Sequence[Sample], selection: SampleSelection,
                     example_id: str) -> list[tuple[Sample, Sample]]:
    """(chosen, rejected) pairs of one prompt: a verified sample against a failed one, at most
    ``pairs_per_prompt``. With L samples on the larger side and S on the smaller, pair ``b * L + l``
    takes the larger side's sample ``l`` and the smaller side's ``(l + b) mod S``: every pair at most
    once, the first L pairs use every sample of the larger side once and the smaller side's in turn."""
    in_order = ordered(samples, selection, example_id)
    chosen, _ = distinct([s for s in in_order if s.correct])
    rejected, _ = distinct([s for s in in_order if not s.correct and s.key not in {c.key for c in chosen}])
    smaller, larger = (chosen, rejected) if len(chosen) < len(rejected) else (rejected, chosen)
    pairs = []
    for block in range(len(smaller)):
        for index, sample in enumerate(larger):
            if len(pairs) == selection.pairs_per_prompt:
                return pairs
            other = smaller[(index + block) % len(smaller)]
            pairs.append((sample, other) if larger is chosen else (other, sample))
    return pairs


def _digest(*texts: str) -> str:
    return hashlib.sha256("\x00".join(normalize_text(t) for t in texts).encode("utf-8")).hexdigest()[:16]


def prompt_text(example: Mapping[str, Any]) -> tuple[str, bool]:
    """(the text the generator read for ``example`` before any chat template, whether it is a chat turn)."""
    from rlax_core.tasks.prompts import prompt_format

    fmt = prompt_format(example["task"])
    return fmt.text(example), fmt.chat


def sft_row(example: Mapping[str, Any], sample: Sample, *, pass_rate: float, generator: str,
            selection: str) -> dict[str, Any]:
    """The ``SFT_EXAMPLE_SCHEMA`` row of one kept sample; its id: the example's id and the completion's hash."""
    prompt, chat = prompt_text(example)
    meta = {"task": example["task"], "chat": chat, "selection": selection, **sample.summary()}
    return {"id": f"{example['id']}-{_digest(sample.text)}", "source": example["source"], "prompt": prompt,
            "completion": sample.text, "messages": None, "example_id": example["id"], "pass_rate": pass_rate,
            "generator": generator, "meta": json.dumps(meta, sort_keys=True)}


def pair_row(example: Mapping[str, Any], chosen: Sample, rejected: Sample, *, pass_rate: float,
             generator: str) -> dict[str, Any]:
    """The ``PREFERENCE_PAIR_SCHEMA`` row of one (verified, failed) pair of the same prompt."""
    prompt, chat = prompt_text(example)
    meta = {"task": example["task"], "chat": chat, "chosen": chosen.summary(), "rejected": rejected.summary()}
    return {"id": f"{example['id']}-{_digest(chosen.text, rejected.text)}", "source": example["source"],
            "prompt": prompt, "chosen": chosen.text, "rejected": rejected.text, "example_id": example["id"],
            "pass_rate": pass_rate, "generator": generator, "meta": json.dumps(meta, sort_keys=True)}


@dataclasses.dataclass(frozen=True)
class PromptData:
    """What one prompt gave: its SFT rows and pairs, its pass rate, and why it gave nothing (or None)."""

    sft: list[dict[str, Any]]
    pairs: list[dict[str, Any]]
    pass_rate: float | None  # None: the prompt was not sampled
    duplicates: int  # verified samples dropped as copies of a kept one (or as empty)
    reason: str | None  # UNSOLVED / SKIPPED, else None
    detail: str = ""


def rejection_sampling_data(result: Mapping[str, Any], selection: SampleSelection, generator: str) -> PromptData:
    """A verified result of ``SampleAndVerify`` -> the prompt's SFT rows and preference pairs."""
    example = result["example"]
    samples = samples_of(result)
    if result.get("skipped") or not samples:
        return PromptData([], [], None, 0, SKIPPED, result.get("skipped") or "no samples")
    rate = pass_rate(samples)
    if rate == 0.0:
        return PromptData([], [], rate, 0, UNSOLVED, f"none of {len(samples)} samples verified")
    _, duplicates = distinct([s for s in samples if s.correct])
    sft = [sft_row(example, s, pass_rate=rate, generator=generator, selection=selection.selection)
           for s in select_verified(samples, selection, example["id"])] if selection.max_per_prompt else []
    pairs = [pair_row(example, c, r, pass_rate=rate, generator=generator)
             for c, r in preference_pairs(samples, selection, example["id"])] if selection.pairs_per_prompt else []
    return PromptData(sft, pairs, rate, duplicates, None)


def generator_name(model: str, name: str | None = None) -> str:
    """What the rows' ``generator`` records: ``name`` when given; a model folder's name; a weight-store
    version or checkpoint step as written (``weights:ROOT@12``), which names the store and its version."""
    from pathlib import PurePosixPath

    from rlax_core.policy.source import PREFIXES

    if name:
        return name
    if model.partition(":")[0] in PREFIXES:
        return model
    return PurePosixPath(model.rstrip("/")).name
