"""The ``reward_model`` term: a learned reward, one score per completion from a sequence-classification model.

    rewards:
      terms: {reward_model: 1.0}                   # weighted with the others like any term
      reward_model: {path: runs/rm/hf, normalize: saved}

The model is a Hugging Face ``*ForSequenceClassification`` folder (transformers' or one ``rlax rm``
exported; ``models.checkpoint`` reads both through its one table) and is read where the term is
built: on a rollout worker, the scoring stage's own devices, next to the policy's engine.

Each sample is rendered again with the reward model's own tokenizer and chat template
(``tasks.prompts.render_prompt`` with that tokenizer, the completion as the assistant's turn), so a
reward model trained with another template reads what it was trained on; with the policy's
template the text is the one the policy read. Scores are normalised by ``normalize``: ``saved``
(the training scores' mean and std saved beside the model, ``training.reward_model.SCORE_STATS_FILE``),
``calibrate`` (the mean and std of the first ``calibration_samples`` scores this term makes, then
frozen; until then those of the scores so far) or ``none``.

A sample whose example cannot be rendered is that sample's failure alone, named; a reward model
whose tokenizer cannot encode the policy's text (its unknown token appears) stops the job with one
line: every score it gave would be of text it did not read.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Literal, Sequence

import numpy as np

from rlax_core.config import require
from rlax_core.rewards.registry import RewardResult, RewardTerm, RewardUnavailable, Sample, register_reward, scoring_failure


RESOURCE_HINTS = ("accelerator", "min_ram", "cpu_count")  # Beam's resource hints a stage may carry


@dataclasses.dataclass(frozen=True)
class RewardModelConfig:
    path: str = ""  # a sequence-classification model folder (local or gs://)
    tokenizer: str = ""  # its tokenizer, when not in the model's folder
    normalize: Literal["saved", "calibrate", "none"] = "saved"
    calibration_samples: int = 64  # normalize: calibrate; the scores whose mean and std are frozen
    batch_size: int = 16  # sequences per forward (padded to it, so one compiled shape per length bucket)
    max_length: int = 1024  # prompt + completion tokens read; longer texts keep their first tokens
    dtype: str = "float32"
    # Where the scoring runs: "rollout_worker" (ScoreRollouts fused with generation: the reward model on
    # the policy's own devices) or "own_stage" (a Reshuffle before ScoreRollouts, which runs on workers
    # with ``resource_hints``, Beam's accelerator / min_ram / cpu_count: for a model that does not fit).
    placement: Literal["rollout_worker", "own_stage"] = "rollout_worker"
    resource_hints: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_placement(self.placement, self.resource_hints)
        require(self.calibration_samples >= 2, "calibration_samples", "must be >= 2 (a std needs two scores)")
        require(self.batch_size >= 1, "batch_size", "must be >= 1")
        require(self.max_length >= 2, "max_length", "must be >= 2")


def check_placement(placement: str, resource_hints: dict[str, str]) -> None:
    """A model's scoring placement and Beam hints (a reward model's, a distillation teacher's)."""
    unknown = sorted(set(resource_hints) - set(RESOURCE_HINTS))
    require(not unknown, "resource_hints", f"unknown hint(s) {unknown}; Beam's are {', '.join(RESOURCE_HINTS)}")
    require(placement == "own_stage" or not resource_hints, "resource_hints",
            "apply to placement: own_stage (on the rollout worker the scoring shares its devices)")


def placed_models(rewards) -> dict:
    """The settings of each model the scoring runs (``placement``, ``resource_hints``): the reward
    model's when a term names it, the distillation teacher's when it has one."""
    models = {}
    if "reward_model" in rewards.terms:
        models["reward_model"] = rewards.reward_model
    distillation = getattr(rewards, "distillation", None)
    if distillation is not None and distillation.enabled:
        models["distillation"] = distillation
    return models


def scoring_stage_hints(rewards) -> dict[str, str] | None:
    """The Beam resource hints of the scoring stage when a model it runs (a reward model, a
    distillation teacher) is placed on its own stage (``placement: own_stage``); None when scoring
    stays fused with generation on the rollout worker."""
    own = [settings for settings in placed_models(rewards).values() if settings.placement == "own_stage"]
    if not own:
        return None
    return {key: value for settings in own for key, value in settings.resource_hints.items()}


def render_for_reward_model(example, completion: str, tokenizer) -> tuple[str, bool]:
    """``(text, add_bos)`` of prompt + completion in the reward model's own format: its chat template
    with the completion as the assistant's turn where the task chats, else the policy's plain text."""
    from rlax_core.tasks.prompts import prompt_format, render_prompt

    fmt = prompt_format(example["task"])
    if fmt.chat and getattr(tokenizer, "chat_template", None):
        turns = [{"role": "user", "content": fmt.text(example)}, {"role": "assistant", "content": completion}]
        return tokenizer.apply_chat_template(turns), False
    text, add_bos = render_prompt(example, tokenizer)
    return text + completion, add_bos


def unknown_token_id(tokenizer) -> int | None:
    """The id a tokenizer gives text it cannot encode (SentencePiece without byte fallback, word
    vocabularies), or None when every text has ids (byte-level BPE)."""
    for token in ("<unk>", "[UNK]", "<|unk|>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return found
    return None


_PROCESS_MODELS: dict[tuple, object] = {}  # one copy per process, whatever the DoFn instances and threads
_PROCESS_MODELS_LOCK = threading.Lock()


def process_shared(key: tuple, build):
    """``build()`` once per process for ``key``: a Beam worker runs a DoFn instance per thread, each
    with its own Rewarder, and a model's weights (and a judge's engine) should be held once, as the
    memory planner counts them."""
    with _PROCESS_MODELS_LOCK:
        if key not in _PROCESS_MODELS:
            _PROCESS_MODELS[key] = build()
        return _PROCESS_MODELS[key]


def length_bucket(length: int, limit: int) -> int:
    """Sequences are padded up to a power of two (at least 16, at most ``limit``): few compiled shapes."""
    return min(limit, max(16, 1 << (max(length, 1) - 1).bit_length()))


@register_reward("reward_model")
class RewardModelScore(RewardTerm):
    """A learned reward: the reward model's score of prompt + completion, normalised (see the module)."""

    def __init__(self, config):
        super().__init__(config)
        import jax

        from rlax_core.models.checkpoint import from_pretrained
        from rlax_core.models.tokenizer import load_tokenizer
        from rlax_core.training.reward_model import read_score_stats, sequence_scores

        settings: RewardModelConfig = config.reward_model
        self.settings = settings
        model = process_shared(("reward_model", settings.path, settings.dtype),
                               lambda: from_pretrained(settings.path, dtype=settings.dtype))
        if not model.config.score_head:
            raise RewardUnavailable(f"reward_model.path {settings.path}: a causal language model, not a reward "
                                    "model (a *ForSequenceClassification with one label)")
        self.model_config, self.params = model.config, model.params
        self.tokenizer = load_tokenizer(settings.tokenizer or settings.path)
        self.unknown_id = unknown_token_id(self.tokenizer)
        self.pad_id = self.model_config.pad_token_id or 0
        shape = self.model_config
        self._forward = process_shared(("reward_model_forward", shape), lambda: jax.jit(
            lambda params, tokens, mask: sequence_scores(params, shape, tokens, mask)))
        self.stats = read_score_stats(settings.path) if settings.normalize == "saved" else None
        if settings.normalize == "saved" and self.stats is None:
            raise RewardUnavailable(f"reward_model.path {settings.path}: no saved score statistics (reward_stats.json); "
                                    "set reward_model.normalize to calibrate or none")
        self._calibration: list[float] = []
        self._lock = threading.Lock()  # a Beam worker may score bundles from several threads

    def score_many(self, samples: Sequence[Sample]) -> list[RewardResult]:
        results: list[RewardResult | None] = [None] * len(samples)
        encoded: list[tuple[int, list[int]]] = []
        for index, sample in enumerate(samples):
            try:
                text, add_bos = render_for_reward_model(sample.example, sample.completion, self.tokenizer)
            except (KeyError, ValueError) as error:  # this sample's example cannot be rendered
                results[index] = scoring_failure(f"example {sample.example.get('id', '?')!r}: "
                                                 f"{type(error).__name__}: {error}")
                continue
            ids = self.tokenizer.encode(text, add_bos=add_bos)
            self._check_encodable(text, ids)
            encoded.append((index, ids[:self.settings.max_length]))
        raw = self.raw_scores([ids for _, ids in encoded])
        for (index, _), score, normalised in zip(encoded, raw, self._normalised(raw)):
            results[index] = RewardResult(normalised, {"raw_score": score})
        return results  # type: ignore[return-value]

    def raw_scores(self, rows: Sequence[Sequence[int]]) -> list[float]:
        """The model's scores of token rows, ``batch_size`` rows per forward."""
        size, out = self.settings.batch_size, []
        for start in range(0, len(rows), size):
            chunk = rows[start:start + size]
            width = length_bucket(max(len(ids) for ids in chunk), self.settings.max_length)
            tokens = np.full((size, width), self.pad_id, np.int32)
            mask = np.zeros((size, width), np.int32)
            mask[len(chunk):, 0] = 1  # filler rows read one pad token
            for row, ids in enumerate(chunk):
                tokens[row, :len(ids)], mask[row, :len(ids)] = ids, 1
            out.extend(float(s) for s in np.asarray(self._forward(self.params, tokens, mask))[:len(chunk)])
        return out

    def _check_encodable(self, text: str, ids: Sequence[int]) -> None:
        beyond = [i for i in ids if i >= self.model_config.vocab_size]
        unknown = self.unknown_id is not None and self.unknown_id in ids and self.tokenizer.decode(
            [self.unknown_id]) not in text
        if beyond or unknown:
            what = f"token id {beyond[0]} beyond its vocabulary of {self.model_config.vocab_size}" if beyond else \
                "its unknown token"
            raise RewardUnavailable(f"reward_model {self.settings.path}: its tokenizer cannot encode the policy's "
                                    f"text ({what} for {text[:60]!r}); use a reward model of the policy's tokenizer family")

    def _normalised(self, raw: Sequence[float]) -> list[float]:
        if self.settings.normalize == "none":
            return list(raw)
        stats = self.stats
        if stats is None:  # calibrating: the scores so far (this batch's included), frozen once there are enough
            with self._lock:
                self._calibration.extend(raw[:self.settings.calibration_samples - len(self._calibration)])
                values = np.asarray(self._calibration)
                stats = {"mean": float(values.mean()), "std": float(values.std())}
                if len(values) >= self.settings.calibration_samples:
                    self.stats = stats
        return [(value - stats["mean"]) / max(stats["std"], 1e-6) for value in raw]
