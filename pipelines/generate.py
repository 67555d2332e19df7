"""``rlax generate``: continue prompts with the rollout engine, greedy or sampled, as text or JSONL.

    rlax generate --model pipelines/assets/stories260K --prompt "Once upon a time" --max-new-tokens 64
    rlax generate --model pipelines/assets/stories260K --prompt "The dog" --temperature 0.8 --top-p 0.9 --n 4 --seed 1
    rlax generate --model Qwen2.5-0.5B-Instruct/ --chat --prompts-file questions.txt --format jsonl --output out.jsonl

Prompts come from ``--prompt`` (repeatable) or ``--prompts-file`` (one prompt per line, or JSONL
rows with a ``prompt`` and optionally an ``id``); an empty prompt generates from BOS alone.
``--chat`` wraps each prompt as one user turn with the tokenizer's chat template. Text output
prints each sample's continuation; JSONL output writes one row per sample with its token ids, the
log-prob of every token (float32 log-softmax of the raw logits), finish reason and seed, so any row
can be regenerated exactly with the same ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

HELP = "generate text from a model (greedy or sampled; text or JSONL with log-probs)"

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="Hugging Face folder, llama2.c .bin or a folder holding one "
                        "(local or gs://), weights:STORE[@VERSION], checkpoint:DIR[@STEP], or assets:stories260K")
    parser.add_argument("--tokenizer", help="tokenizer file or folder (default: --model's folder)")
    parser.add_argument("--prompt", action="append", default=None,
                        help="prompt text; repeat for a batch (default: one empty prompt, i.e. BOS only)")
    parser.add_argument("--prompts-file", help="one prompt per line, or JSONL rows {\"prompt\": ..., \"id\": ...}")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    parser.add_argument("--n", type=int, default=1, help="samples per prompt")
    parser.add_argument("--seed", type=int, default=0, help="with the prompt id and sample index, fixes every sample")
    parser.add_argument("--stop", action="append", default=[], help="stop string; repeatable")
    parser.add_argument("--no-stop", action="store_true", help="do not stop at the end-of-sequence tokens")
    parser.add_argument("--format", choices=["text", "jsonl"], default="text")
    parser.add_argument("--output", help="write here instead of stdout")
    parser.add_argument("--num-slots", type=int, default=16, help="sequences decoded together (per replica)")
    parser.add_argument("--replicas", type=int, default=1,
                        help="engines, one per device, dealt whole prompts; 0 = one per local device. "
                             "On a CPU host each core becomes a device")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--chat", action="store_true", help="render each prompt as a user turn with the chat template")


def read_prompts(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(prompt id, text) pairs from --prompts-file or --prompt."""
    if args.prompts_file:
        lines = Path(args.prompts_file).read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark is not text
        prompts = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as error:
                    raise ValueError(f"{args.prompts_file}:{number}: not valid JSON: {error}") from None
                if not isinstance(row.get("prompt"), str):
                    raise ValueError(f"{args.prompts_file}:{number}: a JSONL row needs a string 'prompt'")
                prompts.append((str(row.get("id", number)), row["prompt"]))
            else:
                prompts.append((str(number), line))
        return prompts
    return [(str(i), text) for i, text in enumerate(args.prompt or [""])]


def _check(args: argparse.Namespace) -> str | None:
    if args.max_new_tokens <= 0:
        return "--max-new-tokens must be > 0"
    if args.prompt and args.prompts_file:
        return "give --prompt or --prompts-file, not both"
    if args.n < 1 or args.num_slots < 1:
        return "--n and --num-slots must be >= 1"
    if args.replicas < 0:
        return "--replicas must be >= 0 (0: one per local device)"
    return None


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    if beam_args:
        print(f"rlax generate: unknown arguments {' '.join(beam_args)}", file=sys.stderr)
        return 2
    problem = _check(args)
    if problem:
        print(f"rlax generate: {problem}", file=sys.stderr)
        return 2

    from rlax_core.utils.devices import use_cpu_cores_as_devices

    if args.replicas != 1:
        use_cpu_cores_as_devices()  # before JAX starts: on a CPU host, one device per core
    import jax.numpy as jnp

    from rlax_core.config import ConfigError
    from rlax_core.inference import EngineConfig, ReplicatedEngine, Request, SamplingParams
    from rlax_core.models.tokenizer import load_tokenizer
    from rlax_core.policy.source import load_policy, tokenizer_path
    from pipelines.config import resolve_asset

    try:
        prompts = read_prompts(args)
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                                  max_new_tokens=args.max_new_tokens, samples_per_prompt=args.n,
                                  stop_strings=tuple(args.stop), ignore_eos=args.no_stop)
    except (OSError, ValueError) as error:  # ConfigError is a ValueError: it names the bad option
        print(f"rlax generate: {error}", file=sys.stderr)
        return 2

    model_dir = resolve_asset(args.model)  # assets:stories260K, the model shipped in the package
    tokenizer = load_tokenizer(args.tokenizer or tokenizer_path(model_dir))
    model = load_policy(model_dir, dtype=jnp.dtype(args.dtype))
    log.info("loaded %s: %s, %.2fM parameters", model_dir, model.config.architecture, model.config.num_params / 1e6)

    requests = []
    for prompt_id, text in prompts:
        if args.chat:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True)
        else:
            # Models with a BOS token (Llama, llama2.c) were trained with it in front of every text.
            ids = tokenizer.encode(text, add_bos=tokenizer.bos_id is not None)
        if not ids:
            print("rlax generate: the prompt is empty and the tokenizer has no BOS token to start from", file=sys.stderr)
            return 2
        requests.append(Request(ids, sampling, prompt_id=prompt_id, seed=args.seed))

    try:
        engine = ReplicatedEngine(_engine_config(EngineConfig, requests, args), model.config, model.params,
                                  detokenize=tokenizer.decode)
    except ValueError as error:  # more replicas than devices
        print(f"rlax generate: {error}", file=sys.stderr)
        return 2
    try:
        completions = engine.generate(requests)
    except (ValueError, ConfigError) as error:
        print(f"rlax generate: {error}", file=sys.stderr)
        return 2

    texts = dict(prompts)
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    try:
        for completion in completions:
            continuation = _continuation(tokenizer, list(completion.prompt_ids), list(completion.completion_ids))
            if args.format == "text":
                print(continuation, file=out, flush=True)
                continue
            print(json.dumps({
                "prompt_id": completion.prompt_id, "prompt": texts[completion.prompt_id],
                "sample_index": completion.sample_index, "seed": completion.seed, "text": continuation,
                "prompt_ids": list(completion.prompt_ids), "completion_ids": list(completion.completion_ids),
                "logprobs": list(completion.logprobs), "finish_reason": completion.finish_reason,
                "weight_version": completion.weight_version,
            }), file=out, flush=True)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


def _engine_config(EngineConfig, requests, args):
    """An engine just big enough for this batch: prompt buckets are powers of two up to the longest."""
    longest = max(len(r.prompt_ids) for r in requests)
    buckets = [16]
    while buckets[-1] < longest:
        buckets.append(buckets[-1] * 2)
    slots = min(args.num_slots, len(requests) * args.n)
    page_size = 16
    per_sequence = -(-(buckets[-1] + args.max_new_tokens) // page_size)
    return EngineConfig(num_slots=slots, page_size=page_size, num_pages=slots * per_sequence + 1,
                        max_prompt_len=buckets[-1], max_new_tokens=args.max_new_tokens,
                        prefill_buckets=tuple(buckets), decode_steps_per_call=32, replicas=args.replicas)


def _continuation(tokenizer, prompt: list[int], new: list[int]) -> str:
    """Decode prompt + continuation together and drop the prompt's text, so that word-initial spaces
    at the seam survive (SentencePiece drops a leading space when decoding alone)."""
    prompt_text = tokenizer.decode(prompt, skip_special_tokens=True)
    full_text = tokenizer.decode(prompt + new, skip_special_tokens=True)
    return full_text[len(prompt_text):] if full_text.startswith(prompt_text) else tokenizer.decode(new, skip_special_tokens=True)
