"""Tokenizers: Hugging Face ``tokenizer.json``, byte-level BPE ``vocab.json`` + ``merges.txt`` (Qwen2),
and SentencePiece ``.model`` (llama2.c's tok512, Llama 2), behind one small interface::

    tok = load_tokenizer("Qwen2.5-0.5B/")          # a folder, a tokenizer file, or gs://...
    ids = tok.encode("What is 2+3?")               # add_bos=True prepends bos_id where there is one
    tok.decode(ids)
    tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)

Chat templates are the Jinja templates of ``tokenizer_config.json`` (or ``chat_template.jinja``),
rendered in a sandbox the way transformers renders them (trim_blocks, lstrip_blocks, the special
tokens as variables, ``raise_exception``).
"""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

from rlax_core.models.checkpoint import local_copy

# Qwen2.5 / Qwen3 control tokens, ids 151643.. in this order. The vocab.json + merges.txt release
# lists only the first three in its config files; the model was trained with all of them.
QWEN2_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
)

# The split rule of Qwen2's byte-level BPE: contractions, letter runs (with one leading non-letter),
# single digits, punctuation runs, newlines, spaces.
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

Message = Mapping[str, Any]


class Tokenizer:
    """Text <-> ids. Subclasses wrap one library; this class holds special tokens and the chat template."""

    def __init__(self, *, bos_token: str | None, eos_token: str | None, pad_token: str | None,
                 special_tokens: Mapping[str, int], chat_template: str | None):
        self.special_tokens = dict(special_tokens)
        self.bos_token, self.eos_token, self.pad_token = bos_token, eos_token, pad_token
        self.chat_template = chat_template

    # Subclasses implement these three.
    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int | None:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_bos`` prepends BOS where the tokenizer has one (Qwen has none),
        as transformers' ``add_special_tokens`` does, so callers need not know the family."""
        ids = self._encode(text)
        if add_bos and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids

    def _id(self, token: str | None) -> int | None:
        return None if token is None else self.token_to_id(token)

    @property
    def bos_id(self) -> int | None:
        return self._id(self.bos_token)

    @property
    def eos_id(self) -> int | None:
        return self._id(self.eos_token)

    @property
    def pad_id(self) -> int | None:
        return self._id(self.pad_token)

    def apply_chat_template(self, messages: Sequence[Message], add_generation_prompt: bool = False,
                            tokenize: bool = False, **variables: Any) -> str | list[int]:
        """Render ``messages`` with the tokenizer's chat template (text, or ids with ``tokenize=True``)."""
        if not self.chat_template:
            raise ValueError("this tokenizer has no chat template (tokenizer_config.json chat_template)")
        text = _compile_template(self.chat_template).render(
            messages=list(messages), add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "", pad_token=self.pad_token or "",
            **variables)
        return self._encode(text) if tokenize else text


class HFTokenizer(Tokenizer):
    """A ``tokenizers.Tokenizer`` (Rust): tokenizer.json, or byte-level BPE from vocab.json + merges.txt."""

    def __init__(self, backend, **kwargs):
        self.backend = backend
        super().__init__(**kwargs)

    def _encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)


class SentencePieceTokenizer(Tokenizer):
    def __init__(self, processor, **kwargs):
        self.processor = processor
        super().__init__(**kwargs)

    def _encode(self, text: str) -> list[int]:
        return self.processor.encode(text)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        # SentencePiece renders control tokens (BOS/EOS) as nothing either way.
        return self.processor.decode([int(i) for i in ids])

    def token_to_id(self, token: str) -> int | None:
        piece = self.processor.piece_to_id(token)
        return None if piece == self.processor.unk_id() and token != self.processor.id_to_piece(piece) else piece

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()


# ----------------------------------------------------------------------------- loading


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """From a folder (tokenizer.json, vocab.json + merges.txt, or one SentencePiece *.model), or a file."""
    with local_copy(str(path)) as local:
        if local.is_file():
            folder, file = local.parent, local
        elif local.is_dir():
            folder, file = local, None
        else:
            raise FileNotFoundError(f"{path}: no such tokenizer file or folder")
        config = _read_json(folder / "tokenizer_config.json")
        if file is not None and file.suffix == ".model":
            return _sentencepiece(file, config)
        if file is not None and file.name.endswith(".json"):
            return _hf_tokenizer_json(file, config)
        if file is not None:
            raise ValueError(f"{path}: expected tokenizer.json or a SentencePiece .model file")
        if (folder / "tokenizer.json").exists():
            return _hf_tokenizer_json(folder / "tokenizer.json", config)
        if (folder / "vocab.json").exists() and (folder / "merges.txt").exists():
            return _byte_level_bpe(folder, config)
        models = sorted(folder.glob("*.model"))
        if len(models) == 1:
            return _sentencepiece(models[0], config)
        raise FileNotFoundError(f"{path}: no tokenizer.json, vocab.json + merges.txt, or single SentencePiece .model")


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as strings or as {"content": ...} objects."""
    return value.get("content") if isinstance(value, Mapping) else value


def _chat_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    if (folder / "chat_template.jinja").exists():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


def _special_token_kwargs(folder: Path, config: Mapping[str, Any], special_tokens: Mapping[str, int]) -> dict:
    return dict(bos_token=_token_text(config.get("bos_token")), eos_token=_token_text(config.get("eos_token")),
                pad_token=_token_text(config.get("pad_token")), special_tokens=special_tokens,
                chat_template=_chat_template(folder, config))


def _hf_tokenizer_json(file: Path, config: Mapping[str, Any]) -> Tokenizer:
    from tokenizers import Tokenizer as RustTokenizer

    backend = RustTokenizer.from_file(str(file))
    special = {token.content: token_id for token_id, token in backend.get_added_tokens_decoder().items() if token.special}
    return HFTokenizer(backend, **_special_token_kwargs(file.parent, config, special))


def _byte_level_bpe(folder: Path, config: Mapping[str, Any]) -> Tokenizer:
    """Qwen2's byte-level BPE, built as its tokenizer.json would describe it."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as RustTokenizer

    backend = RustTokenizer(models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"),
                                                 unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()

    # Added tokens must land on their published ids: new tokens are numbered from the vocab's end.
    declared = {int(i): t["content"] for i, t in config.get("added_tokens_decoder", {}).items()}
    declared.update({i: t for t, i in _read_json(folder / "added_tokens.json").items()})
    if config.get("tokenizer_class") == "Qwen2Tokenizer" or "<|im_start|>" in declared.values():
        first = min(declared) if declared else backend.get_vocab_size()
        declared.update({first + k: token for k, token in enumerate(QWEN2_SPECIAL_TOKENS)})
    for token_id in sorted(declared):
        token = declared[token_id]
        if backend.token_to_id(token) is not None:
            continue
        if backend.get_vocab_size(with_added_tokens=True) != token_id:
            raise ValueError(f"{folder}: special token {token!r} should have id {token_id}, "
                             f"but the vocabulary would give it {backend.get_vocab_size(with_added_tokens=True)}")
        backend.add_special_tokens([AddedToken(token, special=True, normalized=False)])
    special = {token: backend.token_to_id(token) for token in declared.values()}
    return HFTokenizer(backend, **_special_token_kwargs(folder, config, special))


def _sentencepiece(file: Path, config: Mapping[str, Any]) -> Tokenizer:
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(file))
    piece = lambda i: processor.id_to_piece(i) if i >= 0 else None  # noqa: E731
    special = {processor.id_to_piece(i): i for i in range(processor.get_piece_size())
               if processor.is_control(i) or processor.is_unknown(i)}
    kwargs = dict(bos_token=piece(processor.bos_id()), eos_token=piece(processor.eos_id()),
                  pad_token=piece(processor.pad_id()), special_tokens=special,
                  chat_template=_chat_template(file.parent, config))
    for key in ("bos_token", "eos_token", "pad_token"):
        if config.get(key) is not None:
            kwargs[key] = _token_text(config[key])
    return SentencePieceTokenizer(processor, **kwargs)


# ----------------------------------------------------------------------------- chat templates


def _raise_exception(message: str):
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _compile_template(template: str):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # As transformers renders them: whitespace control on, sandboxed, with its helper globals.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda value, indent=None, ensure_ascii=False, **_: json.dumps(
        value, indent=indent, ensure_ascii=ensure_ascii)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)
