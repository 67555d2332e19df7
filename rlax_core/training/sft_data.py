"""Post-training records -> token ids with a trained-token mask -> the trainer's batches.

An ``SftExample`` (``rlax_core.data.records``) is a prompt with its completion, or a whole chat
(``messages``); a ``PreferencePair`` is a prompt with a chosen and a rejected completion. Each
becomes ``tokens`` and ``trained`` (per token: is it a training target?):

* **prompt + completion.** A text prompt is the model's input as it is (what
  ``rlax_core.tasks.prompts.render_prompt`` renders: BOS first unless the tokenizer has a chat
  template, whose rendering places its own); a prompt of chat messages (JSON) goes through the
  tokenizer's chat template with the generation prompt. The completion's tokens follow, then EOS,
  as the engine ends a finished sample; they are trained.
* **a chat.** The chat template renders each prefix of the conversation; each message's tokens are
  the text its rendering adds, so that the assistant turns' spans are exact. ``loss_on=completion``
  trains the last assistant turn, ``assistant`` every assistant turn (the text the template adds
  after the generation prompt, its end-of-turn marker included), ``sequence`` every token.

The batch (``supervised_batch``) has ``batching.make_batch``'s arrays, so the trainer packs and
steps on it as on rollouts: ``loss_mask[t] = trained[t + 1]`` (position t predicts token t + 1).

Bad input is one ``InputError`` line naming the record: a record with neither a completion nor
messages, a chat without an assistant turn, a pair of two conversations with different prompts.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from rlax_core.config import InputError
from rlax_core.training.batching import batch_shapes

ROLES = ("system", "user", "assistant", "tool")


@dataclasses.dataclass(frozen=True)
class Tokenized:
    """One sample: its ids and, per id, whether the loss trains on it."""

    id: str
    tokens: np.ndarray  # int32 [n]
    trained: np.ndarray  # float32 [n]


@dataclasses.dataclass
class LengthCounts:
    """What over-length handling did (the job's metrics)."""

    samples: int = 0
    refused: int = 0
    truncated: int = 0
    windowed: int = 0  # examples cut into windows
    windows: int = 0

    def as_metrics(self, prefix: str) -> dict[str, int]:
        return {f"{prefix}/{name}": value for name, value in dataclasses.asdict(self).items()}


def _messages(text: Any, record_id: str, field: str) -> list[dict[str, Any]] | None:
    """``text`` as a list of chat messages when it is one (JSON), else None."""
    if not isinstance(text, str) or not text.lstrip().startswith("["):
        return None
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError(f"record {record_id}: {field} is not valid chat JSON ({error})") from None
    if not isinstance(messages, list) or not all(isinstance(m, dict) and m.get("role") in ROLES and
                                                 isinstance(m.get("content"), str) for m in messages):
        raise InputError(f"record {record_id}: {field} must be a JSON list of {{role: one of {', '.join(ROLES)}, "
                         "content: text}")
    return messages


def _require_template(tokenizer, record_id: str) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"record {record_id}: chat messages need a tokenizer with a chat template; this one has none")


def _encode_prompt(prompt: str, tokenizer, record_id: str) -> list[int]:
    messages = _messages(prompt, record_id, "prompt")
    if messages is not None:
        _require_template(tokenizer, record_id)
        return list(tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True)))
    return list(tokenizer.encode(prompt, add_bos=not getattr(tokenizer, "chat_template", None)))


def _completion_ids(completion: str, tokenizer) -> list[int]:
    eos = tokenizer.eos_id
    return list(tokenizer.encode(completion)) + ([eos] if eos is not None else [])


def _sample(record_id: str, prompt_ids: Sequence[int], completion_ids: Sequence[int], loss_on: str) -> Tokenized:
    tokens = np.asarray([*prompt_ids, *completion_ids], np.int32)
    trained = np.concatenate([np.full(len(prompt_ids), 1.0 if loss_on == "sequence" else 0.0),
                              np.ones(len(completion_ids))]).astype(np.float32)
    return Tokenized(record_id, tokens, trained)


def _chat(messages: list[dict[str, Any]], tokenizer, record_id: str, loss_on: str) -> Tokenized:
    """A conversation's ids, its assistant turns' spans found by rendering each prefix (module docstring)."""
    assistant_turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant_turns:
        raise InputError(f"record {record_id}: a chat without an assistant turn has nothing to train on")
    _require_template(tokenizer, record_id)
    pieces: list[tuple[str, bool]] = []
    rendered = ""
    for i, message in enumerate(messages):
        if message["role"] == "assistant":  # the generation prompt is context, the reply is trained
            context = tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True)
            pieces.append((_added(rendered, context, record_id), False))
            rendered = context
        full = tokenizer.apply_chat_template(messages[:i + 1])
        trained = message["role"] == "assistant" and (loss_on != "completion" or i == assistant_turns[-1])
        pieces.append((_added(rendered, full, record_id), trained))
        rendered = full
    ids, trained = [], []
    for text, is_trained in pieces:
        piece = tokenizer.encode(text) if text else []
        ids += piece
        trained += [1.0 if is_trained or loss_on == "sequence" else 0.0] * len(piece)
    return Tokenized(record_id, np.asarray(ids, np.int32), np.asarray(trained, np.float32))


def _added(before: str, after: str, record_id: str) -> str:
    if not after.startswith(before):
        raise InputError(f"record {record_id}: the chat template does not render a conversation's prefix as the "
                         "start of the whole, so its turns' tokens cannot be told apart")
    return after[len(before):]


def tokenize_example(record: Mapping[str, Any], tokenizer, loss_on: str = "completion") -> Tokenized:
    """An ``SftExample`` as ids and a trained mask (module docstring)."""
    record_id = str(record.get("id") or "?")
    messages = _messages(record.get("messages"), record_id, "messages")
    if messages is not None:
        return _chat(messages, tokenizer, record_id, loss_on)
    prompt, completion = record.get("prompt"), record.get("completion")
    if not completion:
        raise InputError(f"record {record_id}: an SFT example needs a completion (with its prompt) or messages; "
                         "it has neither")
    if prompt is None:
        raise InputError(f"record {record_id}: a completion without a prompt")
    return _sample(record_id, _encode_prompt(prompt, tokenizer, record_id), _completion_ids(completion, tokenizer),
                   loss_on)


def tokenize_pair(record: Mapping[str, Any], tokenizer) -> tuple[Tokenized, Tokenized]:
    """A ``PreferencePair`` as its chosen and its rejected sample. Chosen and rejected are completions
    of ``prompt``, or two whole conversations (JSON messages) that must agree up to their last turn."""
    record_id = str(record.get("id") or "?")
    chosen, rejected = record.get("chosen"), record.get("rejected")
    if not chosen or not rejected:
        raise InputError(f"pair {record_id}: a preference pair needs a chosen and a rejected completion")
    chosen_chat, rejected_chat = _messages(chosen, record_id, "chosen"), _messages(rejected, record_id, "rejected")
    if (chosen_chat is None) != (rejected_chat is None):
        raise InputError(f"pair {record_id}: chosen and rejected must both be completions or both conversations")
    if chosen_chat is not None:
        for name, chat in (("chosen", chosen_chat), ("rejected", rejected_chat)):
            if not chat or chat[-1]["role"] != "assistant":
                raise InputError(f"pair {record_id}: the {name} conversation does not end with an assistant turn")
        if chosen_chat[:-1] != rejected_chat[:-1]:
            raise InputError(f"pair {record_id}: chosen and rejected have different prompts (the conversations must "
                             "agree up to their last assistant turn)")
        if record.get("prompt") and _messages(record["prompt"], record_id, "prompt") not in (None, chosen_chat[:-1]):
            raise InputError(f"pair {record_id}: the prompt differs from the conversations' shared turns")
        _require_template(tokenizer, record_id)
        prompt_ids = list(tokenizer.encode(tokenizer.apply_chat_template(chosen_chat[:-1], add_generation_prompt=True)))
        chosen, rejected = chosen_chat[-1]["content"], rejected_chat[-1]["content"]
    else:
        if record.get("prompt") is None:
            raise InputError(f"pair {record_id}: completions without a prompt")
        prompt_ids = _encode_prompt(record["prompt"], tokenizer, record_id)
    return (_sample(record_id, prompt_ids, _completion_ids(chosen, tokenizer), "completion"),
            _sample(record_id, prompt_ids, _completion_ids(rejected, tokenizer), "completion"))


def fit_length(samples: Iterable[Tokenized], max_seq_len: int, over_length: str = "refuse",
               overlap: int = 0, counts: LengthCounts | None = None) -> list[Tokenized]:
    """Samples of at most ``max_seq_len`` tokens: longer ones refused, truncated or cut into windows of
    ``max_seq_len`` overlapping by ``overlap``, where each window trains only the targets the one before
    it did not (a window's first token is context only)."""
    counts = counts if counts is not None else LengthCounts()
    out = []
    for sample in samples:
        n = len(sample.tokens)
        if n <= max_seq_len:
            out.append(sample)
        elif over_length == "refuse":
            counts.refused += 1
        elif over_length == "truncate":
            counts.truncated += 1
            out.append(Tokenized(sample.id, sample.tokens[:max_seq_len], sample.trained[:max_seq_len]))
        elif over_length == "window":
            if overlap >= max_seq_len - 1:
                raise InputError(f"sft.window_overlap={overlap} must be below trainer.max_seq_len - 1 = "
                                 f"{max_seq_len - 1}")
            counts.windowed += 1
            start, trained_to = 0, 0  # targets below trained_to were trained by an earlier window
            while trained_to < n:
                end = min(start + max_seq_len, n)
                trained = sample.trained[start:end].copy()
                trained[:max(trained_to - start, 1)] = 0.0
                out.append(Tokenized(sample.id, sample.tokens[start:end], trained))
                counts.windows += 1
                trained_to, start = end, end - overlap - 1 if end < n else end
        else:
            raise ValueError(f"over_length={over_length!r}: expected refuse, truncate or window")
    counts.samples += len(out)
    return out


def supervised_batch(samples: Sequence[Tokenized], *, max_seq_len: int, row_multiple: int = 1, pad_id: int = 0,
                     group_ids: Sequence[int] | None = None, rewards: Sequence[float] | None = None,
                     reference_logprobs: Sequence[float] | None = None) -> dict[str, np.ndarray]:
    """The padded batch of ``samples`` (``make_batch``'s arrays; ``behavior_logprobs`` zero). ``group_ids``
    and ``rewards`` (default: one group per sample, 0): DPO's pairs and which of them is chosen."""
    if not samples:
        raise ValueError("a batch needs at least one sample")
    T = max_seq_len
    batch = {name: np.full(shape, pad_id if name == "tokens" else (-1 if name == "group_ids" else 0), dtype)
             for name, (shape, dtype) in batch_shapes(len(samples), max_seq_len=T, row_multiple=row_multiple).items()}
    for row, sample in enumerate(samples):
        n = len(sample.tokens)
        if n > T:
            raise ValueError(f"sample {sample.id}: {n} tokens, more than trainer.max_seq_len={T}")
        batch["tokens"][row, :n] = sample.tokens
        batch["attention_mask"][row, :n] = 1
        batch["loss_mask"][row, :n - 1] = sample.trained[1:]
    rows = len(samples)
    batch["group_ids"][:rows] = np.arange(rows) if group_ids is None else group_ids
    if rewards is not None:
        batch["rewards"][:rows] = rewards
    batch["sample_mask"][:rows] = 1.0
    if reference_logprobs is not None:
        batch["reference_logprobs"] = np.zeros(len(batch["sample_mask"]), np.float32)
        batch["reference_logprobs"][:rows] = reference_logprobs
    return batch


def preference_batch(pairs: Sequence[tuple[Tokenized, Tokenized]], *, reference_logprobs=None,
                     **kwargs) -> dict[str, np.ndarray]:
    """Chosen and rejected of each pair as two samples of one group, ``rewards`` 1 and 0 (``preference``).
    ``reference_logprobs``: per pair (chosen total, rejected total), when precomputed."""
    samples = [sample for pair in pairs for sample in pair]
    group_ids = np.repeat(np.arange(len(pairs)), 2)
    rewards = np.tile([1.0, 0.0], len(pairs))
    reference = None if reference_logprobs is None else np.asarray(reference_logprobs, np.float32).reshape(-1)
    return supervised_batch(samples, group_ids=group_ids, rewards=rewards, reference_logprobs=reference, **kwargs)
