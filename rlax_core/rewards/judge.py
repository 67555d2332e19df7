"""The ``judge`` term: a generative reward model, or LLM-as-judge, run on the project's engine.

    rewards:
      terms: {math: 1.0, judge: 0.5}
      judge:
        path: Qwen2.5-7B-Instruct/
        template: "Question: {question}\\nAnswer: {completion}\\nReference: {reference}\\nScore (0-10):"
        max_score: 10            # a parsed score s becomes s / max_score
        default_score: 0.0       # the reward when nothing parses (counted: judge_parse_failures)

The template is filled with the example's question (its prompt), the completion and, where the
example has one, its reference answer (``answer``; empty otherwise), then rendered as one user turn
of the judge's chat template when it has one. The judge answers greedily (``temperature`` 0) and the
first match of ``score_pattern`` is the score. The judge's text stays in ``reward_info``
(``judge_text``), so a reader sees why a sample scored what it did.

Pairwise mode (``mode: pairwise``) asks the judge which of two samples of one group (one example's
completions, scored together) is better, with ``{completion_a}`` and ``{completion_b}`` in the
template and ``verdict_pattern`` reading "A" or "B"; with ``both_orders`` every pair is asked twice,
A/B swapped, so a judge's preference for a position cancels. An unreadable verdict is a tie (and
counted). The comparisons become per-sample rewards by ``aggregate``: ``win_rate`` (wins, ties as
half, over the n - 1 opponents) or ``bradley_terry`` (the group's Bradley-Terry strengths, fitted by
Hunter's MM iterations, as log-strengths centred on 0).
"""

from __future__ import annotations

import collections
import dataclasses
import re
import string
import threading
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from rlax_core.config import require
from rlax_core.rewards.registry import RewardResult, RewardTerm, Sample, register_reward, scoring_failure
from rlax_core.rewards.reward_model import process_shared

JUDGE_TEXT_CHARS = 2000  # of the judge's answer kept in reward_info


@dataclasses.dataclass(frozen=True)
class JudgeConfig:
    path: str = ""  # the judge model: a Hugging Face folder or a llama2.c .bin
    tokenizer: str = ""  # its tokenizer, when not in the model's folder
    mode: Literal["pointwise", "pairwise"] = "pointwise"
    template: str = ("Question: {question}\nReference answer: {reference}\nAnswer: {completion}\n"
                     "Rate the answer from 0 to 10. Score:")
    score_pattern: str = r"(-?\d+(?:\.\d+)?)"  # pointwise: group 1 of the first match is the score
    verdict_pattern: str = r"\b([AB])\b"  # pairwise: group 1 of the first match names the better one
    max_score: float = 10.0
    default_score: float = 0.0  # pointwise reward when nothing parses
    aggregate: Literal["win_rate", "bradley_terry"] = "win_rate"
    both_orders: bool = True
    max_new_tokens: int = 64
    max_prompt_len: int = 256
    num_slots: int = 8
    dtype: str = "float32"

    def __post_init__(self):
        fields = {name for _, name, _, _ in string.Formatter().parse(self.template) if name}
        needed = {"completion"} if self.mode == "pointwise" else {"completion_a", "completion_b"}
        allowed = needed | {"question", "reference"}
        missing = sorted(needed - fields)
        require(not missing, "template", f"has no {{{missing[0]}}} placeholder: the judge would never see the "
                f"completion" if missing else "")
        require(fields <= allowed, "template", f"unknown placeholder(s) {sorted(fields - allowed)}; a {self.mode} "
                f"template may name {', '.join(sorted(allowed))}")
        for name in ("score_pattern", "verdict_pattern"):
            require(_capturing_groups(getattr(self, name)) >= 1, name,
                    "needs to be a regular expression with a capturing group: group 1 is what is read")
        require(self.max_score > 0, "max_score", "must be > 0")
        require(self.max_new_tokens >= 1 and self.max_prompt_len >= 16, "max_new_tokens", "the judge needs room "
                "to answer (max_new_tokens >= 1, max_prompt_len >= 16)")


def _capturing_groups(pattern: str) -> int:
    """The pattern's capturing groups; -1 when it is no regular expression."""
    try:
        return re.compile(pattern).groups
    except re.error:
        return -1


def fill_template(template: str, example: Mapping[str, Any], **completions: str) -> str:
    """The judge's prompt for ``example`` and ``completion`` (or ``completion_a`` / ``completion_b``)."""
    reference = example.get("answer")
    return template.format(question=example.get("prompt", ""), reference="" if reference is None else reference,
                           **completions)


def parse_score(text: str, pattern: str, max_score: float) -> float | None:
    """The first score ``pattern`` finds in ``text``, divided by ``max_score``, or None."""
    match = re.search(pattern, text)
    if match is None:
        return None
    try:
        return float(match.group(1)) / max_score
    except ValueError:
        return None


def parse_verdict(text: str, pattern: str) -> str | None:
    """"A" or "B" (the better sample) from the judge's text, or None."""
    match = re.search(pattern, text)
    verdict = match.group(1).strip().upper() if match else None
    return verdict if verdict in ("A", "B") else None


def win_rates(wins: np.ndarray) -> np.ndarray:
    """``wins[i, j]``: comparisons i won against j (ties count half to each). Per sample: its share of
    the comparisons it took part in (0.5 for a sample compared with none)."""
    wins = np.asarray(wins, np.float64)
    played = wins + wins.T
    total = played.sum(axis=1)
    return np.where(total > 0, wins.sum(axis=1) / np.maximum(total, 1e-12), 0.5)


def bradley_terry_strengths(wins: np.ndarray, iterations: int = 200, prior: float = 0.1) -> np.ndarray:
    """Log-strengths (centred on 0) of the Bradley-Terry model fitted to ``wins`` by Hunter's MM
    updates; ``prior`` pseudo-wins against every opponent keep an unbeaten sample finite."""
    wins = np.asarray(wins, np.float64)
    n = wins.shape[0]
    off_diagonal = 1.0 - np.eye(n)
    wins = wins + prior * off_diagonal
    games = (wins + wins.T) * off_diagonal
    strength = np.ones(n)
    for _ in range(iterations):
        denominator = (games / (strength[:, None] + strength[None, :])).sum(axis=1)
        strength = wins.sum(axis=1) / np.maximum(denominator, 1e-12)
        strength /= np.exp(np.mean(np.log(strength)))
    logs = np.log(strength)
    return logs - logs.mean()


@register_reward("judge")
class Judge(RewardTerm):
    """An LLM judge's score of each completion, or of each against the others of its group (see the module)."""

    def __init__(self, config):
        super().__init__(config)
        from rlax_core.models.export import tokenizer_source_of
        from rlax_core.models.tokenizer import load_tokenizer

        settings: JudgeConfig = config.judge
        self.settings = settings
        self.tokenizer = load_tokenizer(settings.tokenizer or tokenizer_source_of(settings.path))
        self.engine, self.sampling, self._lock = process_shared(
            ("judge", settings.path, settings.dtype, settings.max_prompt_len, settings.max_new_tokens,
             settings.num_slots), lambda: self._build_engine(settings))
        self.parse_failures = 0  # judge answers with no score or verdict: scored by the stated default
        self._count_lock = threading.Lock()

    @staticmethod
    def _build_engine(settings: JudgeConfig):
        """The judge's engine, its greedy sampling, and the lock that lets one generate run at a time."""
        from rlax_core.inference.config import EngineConfig, SamplingParams
        from rlax_core.inference.engine import Engine
        from rlax_core.models.checkpoint import from_pretrained

        model = from_pretrained(settings.path, dtype=settings.dtype)
        buckets = tuple(b for b in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096) if b < settings.max_prompt_len)
        engine = EngineConfig(num_slots=settings.num_slots, max_prompt_len=settings.max_prompt_len,
                              max_new_tokens=settings.max_new_tokens,
                              prefill_buckets=(*buckets, settings.max_prompt_len),
                              num_pages=settings.num_slots * -(-(settings.max_prompt_len + settings.max_new_tokens)
                                                               // 16) + 1)
        sampling = SamplingParams(temperature=0.0, max_new_tokens=settings.max_new_tokens,
                                  stop_token_ids=tuple(model.config.eos_token_ids))
        return Engine(engine, model.config, model.params), sampling, threading.Lock()

    def judge_prompts(self, prompts: Sequence[str]) -> list[str]:
        """The judge's greedy answers to ``prompts`` (each rendered as one user turn where it chats)."""
        from rlax_core.inference.engine import Request

        requests = []
        for index, prompt in enumerate(prompts):
            if self.tokenizer.chat_template:
                ids = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                                         add_generation_prompt=True, tokenize=True)
            else:
                ids = self.tokenizer.encode(prompt, add_bos=True)
            # The end of the prompt is what the judge answers: keep it, drop the start of a long one.
            requests.append(Request(tuple(ids[-self.settings.max_prompt_len:]), self.sampling, prompt_id=index))
        with self._lock:
            completions = self.engine.generate(requests)
        by_prompt = {c.prompt_id: c for c in completions}
        return [self.tokenizer.decode(by_prompt[i].completion_ids, skip_special_tokens=True)
                for i in range(len(prompts))]

    def score_many(self, samples: Sequence[Sample]) -> list[RewardResult]:
        if self.settings.mode == "pairwise":
            return self._pairwise(samples)
        prompts, results = [], []
        for sample in samples:
            prompts.append(fill_template(self.settings.template, sample.example, completion=sample.completion))
        for text in self.judge_prompts(prompts):
            score = parse_score(text, self.settings.score_pattern, self.settings.max_score)
            results.append(self._result(score, text))
        return results

    def _result(self, score: float | None, text: str, **info: Any) -> RewardResult:
        parsed = score is not None
        if not parsed:
            with self._count_lock:
                self.parse_failures += 1
        return RewardResult(score if parsed else self.settings.default_score,
                            {"judge_text": text[:JUDGE_TEXT_CHARS], "judge_parsed": parsed, **info})

    def _pairwise(self, samples: Sequence[Sample]) -> list[RewardResult]:
        groups: dict[str, list[int]] = collections.defaultdict(list)
        for index, sample in enumerate(samples):
            groups[str(sample.example.get("id", index))].append(index)
        asks: list[tuple[str, int, int]] = []  # (group, A's index, B's index)
        for key, members in groups.items():
            for a_pos, a in enumerate(members):
                for b in members[a_pos + 1:]:
                    asks.append((key, a, b))
                    if self.settings.both_orders:
                        asks.append((key, b, a))
        prompts = [fill_template(self.settings.template, samples[a].example, completion_a=samples[a].completion,
                                 completion_b=samples[b].completion) for _, a, b in asks]
        texts = self.judge_prompts(prompts)
        results: list[RewardResult | None] = [None] * len(samples)
        for key, members in groups.items():
            position = {sample_index: k for k, sample_index in enumerate(members)}
            wins = np.zeros((len(members), len(members)))
            said: dict[int, list[str]] = collections.defaultdict(list)
            unparsed = 0
            for (group, a, b), text in zip(asks, texts):
                if group != key:
                    continue
                verdict = parse_verdict(text, self.settings.verdict_pattern)
                i, j = position[a], position[b]
                if verdict is None:
                    unparsed += 1
                    wins[i, j] += 0.5
                    wins[j, i] += 0.5
                else:
                    winner, loser = (i, j) if verdict == "A" else (j, i)
                    wins[winner, loser] += 1.0
                for sample_index in (a, b):
                    said[sample_index].append(text[:JUDGE_TEXT_CHARS // 4])
            with self._count_lock:
                self.parse_failures += unparsed
            scores = (win_rates(wins) if self.settings.aggregate == "win_rate" else bradley_terry_strengths(wins))
            for sample_index in members:
                results[sample_index] = RewardResult(float(scores[position[sample_index]]), {
                    "judge_text": "\n---\n".join(said[sample_index])[:JUDGE_TEXT_CHARS],
                    "judge_comparisons": len(said[sample_index]), "judge_unparsed_in_group": unparsed})
        return [r if r is not None else scoring_failure("not judged") for r in results]
