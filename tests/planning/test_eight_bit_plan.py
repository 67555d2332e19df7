"""The planner for eight-bit engines: weights and KV pages counted as an engine places them, and
``num_pages: auto`` grown by the bytes eight bits save."""

import jax
import pytest

from pipelines.config import load_run_config
from pipelines.plan import memory_plans, mismatch_warning
from rlax_core.inference.config import EngineConfig
from rlax_core.inference.engine import Engine
from rlax_core.models.config import ModelConfig
from rlax_core.models.transformer import init_params
from rlax_core.planning.hardware import SliceSpec
from rlax_core.planning.memory import plan_rollout
from tests.support.device_bytes import bytes_on

QWQ = "configs/qwq32b_code_tpu_1024.yaml"
EIGHT_BITS = ["engine.weight_dtype=int8", "engine.cache_dtype=int8"]


def test_the_plan_counts_the_eight_bit_weights_and_pages_an_engine_places():
    model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                        num_kv_heads=2, head_dim=8, qk_norm=True)
    config = EngineConfig(num_slots=2, page_size=4, num_pages=12, max_prompt_len=8, max_new_tokens=8,
                          prefill_buckets=(8,), attention_impl="window", weight_dtype="int8", cache_dtype="int8")
    device = jax.local_devices()[0]
    engine = Engine(config, model, init_params(model, jax.random.key(0)), device=device)
    plan = plan_rollout(model, config, SliceSpec(chip="cpu", chips_per_host=1, memory_gib=1), "float32")
    assert plan.parts["weights"] == bytes_on(device, jax.tree.leaves(engine.params))
    assert plan.parts["KV pool"] == bytes_on(device, jax.tree.leaves(engine.cache))
    full = plan_rollout(model, EngineConfig(**{**config.__dict__, "weight_dtype": "bfloat16", "cache_dtype": "float32"}),
                        SliceSpec(chip="cpu", chips_per_host=1, memory_gib=1), "float32")
    # (8 + 4) bytes a head-token against 8 x 4, and the scale pools' page axis rounded up from 12 to 16
    # (kv_cache.scale_pool_shape): 4 unused pages of float32 scales, keys and values, 2 layers, 2 heads.
    assert plan.parts["KV pool"] == full.parts["KV pool"] * 12 // 32 + 2 * 2 * 2 * 4 * config.page_size * 4


def test_auto_pages_grow_by_the_bytes_eight_bits_save_on_the_qwq_rollout_chips():
    (full,), (eight,) = (memory_plans(load_run_config(QWQ, overrides), roles=("rollout",)) for overrides in ([], EIGHT_BITS))
    saved = sum(full.parts.values()) - full.parts["KV pool"] - (sum(eight.parts.values()) - eight.parts["KV pool"])
    assert saved > 0.4 * full.parts["weights"]  # the weights near halve, less one projection of one layer at full width
    page = lambda plan: plan.parts["KV pool"] // plan.num_pages
    assert eight.parts["KV pool"] - full.parts["KV pool"] == pytest.approx(saved, abs=page(eight) + page(full))
    # QwQ's head_dim 128, bfloat16 pages; the scale pools' last few rows of padding are a 1e-4 share
    assert page(eight) / page(full) == pytest.approx((128 + 4) / 256, rel=1e-4)
    assert eight.num_pages > 2 * full.num_pages


def test_an_eight_bit_engine_gets_tis_unless_the_run_names_a_correction_and_plan_warns_without_one():
    config = load_run_config(QWQ, EIGHT_BITS)
    assert (config.algorithm.mismatch_correction, config.algorithm.mismatch_level,
            config.algorithm.mismatch_high) == ("tis", "token", 2.0)
    assert mismatch_warning(config) is None
    assert load_run_config(QWQ, []).algorithm.mismatch_correction == "none"  # a bfloat16 engine: unchanged
    bare = load_run_config(QWQ, [*EIGHT_BITS, "algorithm.mismatch_correction=none"])
    assert bare.algorithm.mismatch_correction == "none"
    assert "without a mismatch correction" in mismatch_warning(bare)


def test_a_decode_steps_kv_reads_count_whole_pages_by_dtype_as_by_hand():
    from rlax_core.planning.memory import decode_kv_read_bytes
    # 2 layers, 4 KV heads of 8 numbers, pages of 4 tokens; sequences of 1, 4 and 5 tokens hold 1, 1 and
    # 2 pages: 16 tokens. bfloat16: 2 (K, V) x 2 layers x 4 heads x 16 tokens x 8 x 2 bytes = 4,096.
    model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                        num_kv_heads=4, head_dim=8)
    config = EngineConfig(num_slots=4, page_size=4, num_pages=12, max_prompt_len=8, max_new_tokens=8,
                          prefill_buckets=(8,), cache_dtype="bfloat16")
    assert decode_kv_read_bytes(model, config, [1, 4, 5]) == 4096
    # int8: 8 bytes and a 4-byte scale a head-token: 2 x 2 x 4 x 16 x 12 = 3,072.
    int8 = EngineConfig(**{**config.__dict__, "cache_dtype": "int8"})
    assert decode_kv_read_bytes(model, int8, [1, 4, 5]) == 3072
    # tensor_parallel 2 splits the 4 heads: half on each chip; 3 does not divide them: all on each.
    assert decode_kv_read_bytes(model, EngineConfig(**{**config.__dict__, "tensor_parallel": 2}), [1, 4, 5]) == 2048
    assert decode_kv_read_bytes(model, EngineConfig(**{**config.__dict__, "tensor_parallel": 3}), [1, 4, 5]) == 4096
