"""``rlax generate``: print a model's continuation of a prompt (greedy in this version).

    rlax generate --model pipelines/assets/stories260K --prompt "Once upon a time" --max-new-tokens 64 --temperature 0
    rlax generate --model Qwen2.5-0.5B-Instruct/ --chat --prompt "What is 2+3?"

An empty prompt generates from BOS alone. ``--chat`` wraps the prompt as one user turn with the
tokenizer's chat template.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

HELP = "generate text from a model (greedy)"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face folder, llama2.c .bin or a folder holding one (local or gs://)")
    parser.add_argument("--tokenizer", help="tokenizer file or folder (default: --model's folder)")
    parser.add_argument("--prompt", action="append", default=None,
                        help="prompt text; repeat for a batch (default: one empty prompt, i.e. BOS only)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (the only mode of this version)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--chat", action="store_true", help="render each prompt as a user turn with the chat template")
    parser.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-sequence tokens")


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    if beam_args:
        print(f"rlax generate: unknown arguments {' '.join(beam_args)}", file=sys.stderr)
        return 2
    if args.temperature != 0:
        print("rlax generate: only --temperature 0 (greedy) is available in this build", file=sys.stderr)
        return 2
    if args.max_new_tokens <= 0:
        print("rlax generate: --max-new-tokens must be > 0", file=sys.stderr)
        return 2

    import jax.numpy as jnp

    from rlax_core.models import from_pretrained
    from rlax_core.models.generate import greedy_generate
    from rlax_core.models.tokenizer import load_tokenizer

    model_dir = args.model
    # A llama2.c .bin keeps its tokenizer beside it; a folder holds its own.
    tokenizer_path = args.tokenizer or (os.path.dirname(model_dir) or "." if model_dir.endswith(".bin") else model_dir)
    tokenizer = load_tokenizer(tokenizer_path)
    model = from_pretrained(model_dir, dtype=jnp.dtype(args.dtype))
    log.info("loaded %s: %s, %.2fM parameters", model_dir, model.config.architecture, model.config.num_params / 1e6)

    prompts = args.prompt or [""]
    encoded = []
    for text in prompts:
        if args.chat:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True)
        else:
            # Models with a BOS token (Llama, llama2.c) were trained with it in front of every text.
            ids = tokenizer.encode(text, add_bos=True)
        if not ids:
            print("rlax generate: the prompt is empty and the tokenizer has no BOS token to start from", file=sys.stderr)
            return 2
        encoded.append(ids)
    stops = [] if args.no_stop else None
    for ids, new in zip(encoded, greedy_generate(model, encoded, args.max_new_tokens, stop_token_ids=stops)):
        # Decode prompt + continuation together and drop the prompt's text, so that word-initial
        # spaces at the seam survive (SentencePiece drops a leading space when decoding alone).
        prompt_text = tokenizer.decode(ids, skip_special_tokens=True)
        full_text = tokenizer.decode(ids + new, skip_special_tokens=True)
        continuation = full_text[len(prompt_text):] if full_text.startswith(prompt_text) else tokenizer.decode(new)
        print(continuation, flush=True)
    return 0
