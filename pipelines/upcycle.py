"""``rlax upcycle``: a dense Llama-family model turned into a Mixtral-style mixture of experts, as a model folder.

    rlax upcycle --model pipelines/assets/stories260K --out runs/stories260K-moe --experts 4 --experts-per-token 2

Each layer's MLP is copied into ``--experts`` experts with relative noise ``--noise`` and a small
random router is added (``rlax_core.models.upcycle``); the folder holds the weights, ``config.json``
(``MixtralForCausalLM``), the tokenizer and generation settings, and loads wherever a model path is
taken (``rlax generate --model``, a recipe's ``model.path``) and in transformers.
"""

from __future__ import annotations

import argparse

HELP = "turn a dense Llama-family model into a mixture of experts (its MLP copied into each expert)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="the dense model: a Hugging Face folder or llama2.c .bin")
    parser.add_argument("--out", required=True, help="the folder to write (local or gs://)")
    parser.add_argument("--experts", type=int, default=4, help="experts per layer (default 4)")
    parser.add_argument("--experts-per-token", type=int, default=2, help="experts each token runs (default 2)")
    parser.add_argument("--noise", type=float, default=0.01,
                        help="each expert's weights get noise of this times the kernel's std (default 0.01)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    from rlax_core.models.upcycle import upcycle_folder

    config = upcycle_folder(args.model, args.out, num_experts=args.experts, experts_per_token=args.experts_per_token,
                            noise=args.noise, seed=args.seed)
    print(f"{args.out}: {config.num_params:,} parameters ({config.num_active_params:,} active per token), "
          f"{args.experts} experts per layer, {args.experts_per_token} per token")
    return 0
