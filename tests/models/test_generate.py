"""Greedy decoding through the KV cache, and `rlax generate` end to end."""
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipelines.cli import main as rlax
from rlax_core.models import forward_with_cache, from_pretrained, init_cache
from rlax_core.models.generate import greedy_generate
from rlax_core.models.tokenizer import load_tokenizer

REPO = Path(__file__).resolve().parents[2]
STORIES = REPO / "pipelines/assets/stories260K"


@pytest.mark.parametrize("name", ["qwen2_tiny", "stories260K"])
def test_cached_decode_matches_transformers_step_by_step(golden_dir, name):
    golden = np.load(golden_dir / name / "golden.npz")
    model = from_pretrained(golden_dir / name)
    prompt = jnp.asarray(golden["greedy_prompt_ids"])[None]
    steps = len(golden["greedy_new_ids"])
    step_fn = jax.jit(forward_with_cache, static_argnames=("config", "last_token_only"))
    cache = init_cache(model.config, 1, prompt.shape[1] + steps)
    logits, cache = step_fn(model.params, model.config, prompt, jnp.arange(prompt.shape[1])[None], cache,
                            last_token_only=True)
    new_ids = []
    for step in range(steps):
        np.testing.assert_allclose(logits[0, -1], golden["greedy_step_logits"][step], atol=1e-4, rtol=0)
        token = int(jnp.argmax(logits[0, -1]))
        new_ids.append(token)
        position = jnp.asarray([[prompt.shape[1] + step]])
        logits, cache = step_fn(model.params, model.config, jnp.asarray([[token]]), position, cache)
    assert new_ids == golden["greedy_new_ids"].tolist()


def test_greedy_generate_batches_left_padded_prompts_like_single_ones(golden_dir):
    golden = np.load(golden_dir / "stories260K/golden.npz")
    model = from_pretrained(golden_dir / "stories260K")
    long_prompt, short_prompt = golden["greedy_prompt_ids"].tolist(), golden["prompt_ids"].tolist()
    batched = greedy_generate(model, [long_prompt, short_prompt], max_new_tokens=16, stop_token_ids=[])
    assert batched[0] == golden["greedy_new_ids"].tolist()
    assert batched[1] == golden["prompt_greedy_new_ids"].tolist()


def test_rlax_generate_continues_a_prompt(capsys, golden_dir):
    golden = np.load(golden_dir / "stories260K/golden.npz")
    code = rlax(["generate", "--model", str(STORIES), "--prompt", "Once upon a time", "--max-new-tokens", "16",
                 "--temperature", "0"])
    assert code == 0
    assert capsys.readouterr().out == str(golden["prompt_greedy_text"]) + "\n"


def _readme_sample() -> str:
    readme = (STORIES / "README_stories260K.md").read_text()
    block = re.search(r"-t 0\.0\n(.*?)\n```", readme, re.S).group(1)
    return block


@pytest.mark.slow  # a fresh interpreter: JAX import and compile, ~15 s
def test_rlax_generate_from_bos_reproduces_the_readme_sample():
    """Through the real command line: 256 greedy tokens from BOS, as llama2.c's run.c prints them."""
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "generate", "--model", "pipelines/assets/stories260K",
         "--prompt", "", "--max-new-tokens", "256", "--temperature", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    expected = _readme_sample()
    assert len(load_tokenizer(STORIES).encode(expected)) >= 200  # the whole printed sample, not a prefix
    assert result.stdout.rstrip("\n") == expected


def test_rlax_generate_rejects_a_bad_length(capsys):
    assert rlax(["generate", "--model", str(STORIES), "--max-new-tokens", "0"]) == 2
    assert "--max-new-tokens must be > 0" in capsys.readouterr().err
