"""Loading streams: peak host memory stays near one copy of the checkpoint, not two."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import pytest

from rlax_core.models import Model, init_params, save_pretrained, toy_config

REPO = Path(__file__).resolve().parents[2]

# Samples the process's anonymous resident memory (file-backed pages of the memory-mapped
# safetensors are page cache, reclaimable, and not what "needs twice its size" is about).
PROBE = textwrap.dedent("""
    import json, sys, threading, time
    import jax, jax.numpy as jnp
    from rlax_core.models import from_pretrained

    def anon_bytes():
        for line in open("/proc/self/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024

    jnp.zeros(1).block_until_ready()
    base = anon_bytes()
    peak, done = [base], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], anon_bytes())
            time.sleep(0.001)

    sampler = threading.Thread(target=sample)
    sampler.start()
    model = from_pretrained(sys.argv[1])
    jax.block_until_ready(model.params)
    done.set()
    sampler.join()
    print(json.dumps({"base": base, "peak": max(peak[0], anon_bytes())}))
""")


@pytest.mark.slow
def test_loading_needs_about_one_copy_of_the_checkpoint(tmp_path):
    # Many thin layers: the largest stacked parameter (what is held twice for a moment) is small.
    config = toy_config(vocab_size=2048, hidden_size=256, intermediate_size=512, num_layers=64, num_heads=4,
                        num_kv_heads=2, head_dim=64, tie_word_embeddings=False)
    save_pretrained(Model(config, init_params(config, jax.random.key(0))), tmp_path, max_shard_size="50MB")
    checkpoint_bytes = sum(f.stat().st_size for f in tmp_path.glob("*.safetensors"))
    assert checkpoint_bytes > 150e6
    result = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], cwd=REPO, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    memory = json.loads(result.stdout)
    growth = memory["peak"] - memory["base"]
    # Reading everything first and then building params would need >= 2x.
    assert growth < 1.5 * checkpoint_bytes, (growth / checkpoint_bytes, memory)
