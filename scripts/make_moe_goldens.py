"""Writes tests/fixtures/golden/{qwen3_moe_tiny,qwen2_moe_tiny,mixtral_tiny}: tiny random mixtures of experts made and run by
Hugging Face transformers (float32, eager attention), for tests/models/test_golden_logits.py.

Needs torch and transformers, which the project's environment does not install; run it from a throwaway one:

    python -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers safetensors numpy
    /tmp/venv-hf/bin/python scripts/make_moe_goldens.py [--out tests/fixtures/golden]

The routers' weights are drawn larger than the rest (std 0.3) so that the router's choices are not
near-uniform; a near-tie between a token's k-th and (k+1)-th expert would let float rounding pick a
different expert in torch and in JAX. The script prints the smallest such logit gap at a real token;
tests/fixtures/golden/README.md records it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
import transformers

VOCAB, SEQ = 512, 16
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              head_dim=16, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, rms_norm_eps=1e-6,
              max_position_embeddings=256, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, initializer_range=0.1)
MODELS = {
    # Layer 1 is dense (mlp_only_layers); layers 0 and 2 sparse; the top-2 probabilities renormalised.
    "qwen3_moe_tiny": (transformers.Qwen3MoeConfig, dict(num_hidden_layers=3, mlp_only_layers=[1], norm_topk_prob=True,
                                                         rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    # decoder_sparse_step 2: layers 1 and 3 sparse, 0 and 2 dense; a gated shared expert; raw top-2 weights.
    "qwen2_moe_tiny": (transformers.Qwen2MoeConfig, dict(num_hidden_layers=4, decoder_sparse_step=2,
                                                         shared_expert_intermediate_size=48, norm_topk_prob=False,
                                                         rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    # Llama attention, every layer sparse, experts of intermediate_size (what stories260K upcycles into).
    "mixtral_tiny": (transformers.MixtralConfig, dict(num_hidden_layers=2, intermediate_size=32,
                                                      rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
}


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random, so that each one matters: norms near 1, routers wide (no near-ties)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            elif name.endswith("mlp.gate.weight") or name.endswith("mlp.router.weight"):
                param.copy_(0.3 * torch.randn(param.shape, generator=generator))
            else:
                param.copy_(0.1 * torch.randn(param.shape, generator=generator))


def make(name: str, out: Path, seed: int) -> None:
    config_class, extra = MODELS[name]
    common = dict(COMMON)
    if config_class is transformers.MixtralConfig:  # one width, the experts'; the expert count is num_local_experts
        common.pop("moe_intermediate_size")
        common["num_local_experts"] = common.pop("num_experts")
        common.pop("intermediate_size")
    config = config_class(**common, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    randomize(model, seed)
    folder = out / name
    model.save_pretrained(folder)
    (folder / "generation_config.json").unlink()  # the tests need the weights and config.json only

    rng = np.random.default_rng(seed)
    input_ids = rng.integers(3, VOCAB, (2, SEQ)).astype(np.int32)
    attention_mask = np.ones((2, SEQ), np.int32)
    attention_mask[1, 10:] = 0  # row 1: 10 real tokens, right-padded with id 0
    input_ids[1, 10:] = 0
    position_ids = np.tile(np.arange(SEQ, dtype=np.int32), (2, 1))
    with torch.inference_mode():
        result = model(torch.from_numpy(input_ids).long(), attention_mask=torch.from_numpy(attention_mask),
                       position_ids=torch.from_numpy(position_ids).long(), output_router_logits=True)
    logits = result.logits.numpy().astype(np.float32)
    router_logits = np.stack([r.reshape(2, SEQ, -1).numpy() for r in result.router_logits]).astype(np.float32)

    # Softmax keeps the order of the logits: the k-th and (k+1)-th logits' gap is the margin against a flip.
    ranked = np.sort(router_logits, axis=-1)[..., ::-1]
    k = config.num_experts_per_tok
    gap = (ranked[..., k - 1] - ranked[..., k])[:, attention_mask.astype(bool)]
    np.savez(folder / "golden.npz", input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
             logits=logits, router_logits=router_logits)
    files = sorted(p.name for p in folder.iterdir())
    print(f"{name}: {files}; smallest logit gap between a real token's expert {k} and {k + 1}: {gap.min():.4f}; "
          f"torch {torch.__version__}, transformers {transformers.__version__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/fixtures/golden")
    args = parser.parse_args()
    for seed, name in enumerate(MODELS):
        make(name, args.out, seed)


if __name__ == "__main__":
    main()
