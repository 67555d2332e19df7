"""The forward pass against Hugging Face transformers' own logits (tests/fixtures/golden, float32, eager)."""
import numpy as np
import pytest

from rlax_core.models import from_pretrained


@pytest.mark.parametrize("name", ["qwen2_tiny", "stories260K"])
def test_logits_match_transformers_on_a_padded_batch(golden_dir, name):
    golden = np.load(golden_dir / name / "golden.npz")
    model = from_pretrained(golden_dir / name)
    logits = np.asarray(model(golden["input_ids"], golden["attention_mask"]))
    assert logits.dtype == np.float32
    real = golden["attention_mask"].astype(bool)
    assert not real.all(), "the golden batch should contain padding"
    np.testing.assert_allclose(logits[real], golden["logits"][real], atol=1e-4, rtol=0)


@pytest.mark.parametrize("keep_interleaved_rope", [False, True])
def test_llama2c_bin_matches_the_converted_golden(stories260k_dir, golden_dir, keep_interleaved_rope):
    """Both ways of reading llama2.c's interleaved RoPE give Hugging Face's logits."""
    golden = np.load(golden_dir / "stories260K" / "golden.npz")
    model = from_pretrained(stories260k_dir / "stories260K.bin", keep_interleaved_rope=keep_interleaved_rope)
    assert model.config.rope_interleaved == keep_interleaved_rope
    logits = np.asarray(model(golden["input_ids"], golden["attention_mask"]))
    real = golden["attention_mask"].astype(bool)
    np.testing.assert_allclose(logits[real], golden["logits"][real], atol=1e-4, rtol=0)
