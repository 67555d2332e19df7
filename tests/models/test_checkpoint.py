"""Saving and loading Hugging Face checkpoints: bit-exact round trips, HF names and shapes, strict errors."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from rlax_core.config import ConfigError
from rlax_core.models import CheckpointError, Model, from_pretrained, init_params, save_pretrained, toy_config


def _hf_shapes(path):
    with safe_open(path, framework="numpy") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


def _assert_same_params(a, b):
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape, path
        assert np.array_equal(np.asarray(x), np.asarray(y)), path


@pytest.mark.parametrize("name", ["qwen2_tiny", "stories260K"])
def test_save_writes_transformers_names_shapes_and_config(tmp_path, golden_dir, name):
    model = from_pretrained(golden_dir / name)
    assert save_pretrained(model, tmp_path) == ["config.json", "model.safetensors"]
    assert _hf_shapes(tmp_path / "model.safetensors") == _hf_shapes(golden_dir / name / "model.safetensors")
    ours, theirs = load_file(tmp_path / "model.safetensors"), load_file(golden_dir / name / "model.safetensors")
    for tensor, value in theirs.items():  # the [out, in] layouts themselves, not just the shapes
        assert np.array_equal(ours[tensor], value), tensor
    config = json.loads((tmp_path / "config.json").read_text())
    golden_config = json.loads((golden_dir / name / "config.json").read_text())
    for key in ("architectures", "model_type", "hidden_size", "num_hidden_layers", "num_key_value_heads",
                "tie_word_embeddings", "vocab_size", "rms_norm_eps"):
        assert config[key] == golden_config[key], key
    assert config["rope_theta"] == golden_config["rope_parameters"]["rope_theta"]


@pytest.fixture(scope="module")
def untied_toy():
    config = toy_config(tie_word_embeddings=False, qkv_bias=True)
    return Model(config, init_params(config, jax.random.key(0)))


@pytest.mark.parametrize("dtype", [jnp.float32, pytest.param(jnp.bfloat16, marks=pytest.mark.slow)])
def test_sharded_save_then_load_is_bit_exact(tmp_path, untied_toy, dtype):
    config = untied_toy.config
    model = Model(config, jax.tree.map(lambda x: x.astype(dtype), untied_toy.params))
    written = save_pretrained(model, tmp_path, max_shard_size="40KB")
    shards = [f for f in written if f.endswith(".safetensors")]
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert "lm_head.weight" in index["weight_map"]
    loaded = from_pretrained(tmp_path, dtype=dtype)
    assert loaded.config == config
    _assert_same_params(model.params, loaded.params)


def test_single_file_round_trip_of_a_tied_qwen3(tmp_path):
    config = toy_config(architecture="qwen3", qkv_bias=False, qk_norm=True, tie_word_embeddings=True)
    model = Model(config, init_params(config, jax.random.key(1)))
    save_pretrained(model, tmp_path)
    names = _hf_shapes(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in names
    assert names["model.layers.0.self_attn.q_norm.weight"] == (config.head_dim,)
    _assert_same_params(model.params, from_pretrained(tmp_path).params)


def test_loading_in_bfloat16_gives_bfloat16_params_and_float32_logits(golden_dir):
    golden = np.load(golden_dir / "qwen2_tiny/golden.npz")
    model = from_pretrained(golden_dir / "qwen2_tiny", dtype=jnp.bfloat16)
    assert {leaf.dtype for leaf in jax.tree.leaves(model.params)} == {jnp.dtype(jnp.bfloat16)}
    logits = model(golden["input_ids"], golden["attention_mask"])
    assert logits.dtype == jnp.float32
    real = golden["attention_mask"].astype(bool)
    np.testing.assert_allclose(np.asarray(logits)[real], golden["logits"][real], atol=0.15)


# ----------------------------------------------------------------------------- bad checkpoints


@pytest.fixture
def tiny_checkpoint(tmp_path, golden_dir):
    """A writable copy of qwen2_tiny: (folder, tensors)."""
    (tmp_path / "config.json").write_text((golden_dir / "qwen2_tiny/config.json").read_text())
    return tmp_path, load_file(golden_dir / "qwen2_tiny/model.safetensors")


def test_a_missing_tensor_is_named(tiny_checkpoint):
    folder, tensors = tiny_checkpoint
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight"):
        from_pretrained(folder)


def test_an_extra_tensor_is_named(tiny_checkpoint):
    folder, tensors = tiny_checkpoint
    tensors["model.layers.2.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"unexpected tensor model\.layers\.2\.mlp\.up_proj\.weight"):
        from_pretrained(folder)


def test_a_mis_shaped_tensor_is_named(tiny_checkpoint):
    folder, tensors = tiny_checkpoint
    tensors["model.layers.0.self_attn.k_proj.weight"] = np.zeros((64, 64), np.float32)
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight has shape \[64, 64\], expected \[32, 64\]"):
        from_pretrained(folder)


def test_a_missing_shard_is_named(tmp_path, untied_toy):
    written = save_pretrained(untied_toy, tmp_path, max_shard_size="40KB")
    (tmp_path / written[2]).unlink()
    with pytest.raises(CheckpointError, match=f"shard {written[2]} named in model.safetensors.index.json is missing"):
        from_pretrained(tmp_path)


@pytest.mark.parametrize("change, key", [
    ({"architectures": ["MistralForCausalLM"], "model_type": "mistral"}, "config.json architectures"),
    ({"architectures": None, "model_type": "gemma"}, "config.json model_type"),
    ({"use_sliding_window": True}, "config.json use_sliding_window"),
    ({"hidden_act": "gelu"}, "config.json hidden_act"),
    ({"rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0}}, "config.json rope_parameters.rope_type"),
    ({"layer_types": ["full_attention", "sliding_attention"]}, "config.json layer_types"),
    ({"num_key_value_heads": 3}, "config.json num_kv_heads"),
])
def test_unknown_architecture_or_unsupported_option_is_named(tiny_checkpoint, golden_dir, change, key):
    folder, tensors = tiny_checkpoint
    save_file(tensors, folder / "model.safetensors")
    config = json.loads((golden_dir / "qwen2_tiny/config.json").read_text())
    config.update(change)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as error:
        from_pretrained(folder)
    assert error.value.path == key


def test_a_truncated_llama2c_file_fails_with_its_sizes(tmp_path, stories260k_dir):
    data = (stories260k_dir / "stories260K.bin").read_bytes()
    (tmp_path / "broken.bin").write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match=r"1056440 bytes, but its header .* implies 1056540"):
        from_pretrained(tmp_path / "broken.bin")


def test_a_folder_without_a_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(CheckpointError, match="neither a config.json"):
        from_pretrained(tmp_path)


def test_remote_folders_load_and_save_through_fsspec(golden_dir):
    """gs:// goes through fsspec like any remote filesystem; memory:// stands in for it here."""
    import fsspec

    fs = fsspec.filesystem("memory")
    for file in ("config.json", "model.safetensors"):
        fs.pipe(f"/ckpt/{file}", (golden_dir / "qwen2_tiny" / file).read_bytes())
    remote = from_pretrained("memory://ckpt")
    local = from_pretrained(golden_dir / "qwen2_tiny")
    _assert_same_params(local.params, remote.params)
    save_pretrained(remote, "memory://saved", max_shard_size="100KB")
    assert fs.exists("/saved/model.safetensors.index.json")
    _assert_same_params(local.params, from_pretrained("memory://saved").params)
    fs.rm("/ckpt", recursive=True)
    fs.rm("/saved", recursive=True)
