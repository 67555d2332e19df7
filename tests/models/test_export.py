"""``export_hf``: a complete Hugging Face folder (weights, config, tokenizer, generation settings), local or gs://."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from rlax_core.models import Model, from_pretrained, init_params, load_tokenizer, toy_config
from rlax_core.models.export import export_hf
from rlax_core.policy.source import load_policy, parse_policy_source

STORIES = Path(__file__).resolve().parents[2] / "pipelines" / "assets" / "stories260K"
IDS = np.array([[1, 5, 9, 200, 17]], np.int32)


@pytest.fixture(scope="module")
def toy():
    config = toy_config(vocab_size=512)
    return Model(config, init_params(config, jax.random.key(3)))


@pytest.mark.parametrize("backend", ["local", "gs"])
def test_export_round_trips_weights_tokenizer_and_generation_settings(toy, tmp_path, request, backend):
    root = str(tmp_path) if backend == "local" else request.getfixturevalue("gcs_emulator").make_bucket()
    destination = f"{root}/export/step_00000003"
    written = export_hf(destination, toy.config, toy.params, tokenizer_source=str(STORIES / "stories260K.bin"),
                        generation={"temperature": 0.7, "max_new_tokens": 32, "eos_token_id": [2, 13]})
    assert written[-1] == "config.json"  # last: a reader never takes a half-written folder for a model
    assert {"model.safetensors", "tokenizer.model", "tokenizer_config.json", "generation_config.json"} <= set(written)

    loaded = from_pretrained(destination)
    np.testing.assert_array_equal(np.asarray(loaded(IDS)), np.asarray(toy(IDS)))
    text = "Lily saw a big red ball."
    assert load_tokenizer(destination).encode(text, add_bos=True) == load_tokenizer(STORIES).encode(text, add_bos=True)
    if backend == "local":
        generation = json.loads(Path(destination, "generation_config.json").read_text())
        assert generation == {"bos_token_id": toy.config.bos_token_id, "eos_token_id": [2, 13],
                              "pad_token_id": toy.config.pad_token_id, "temperature": 0.7, "do_sample": True,
                              "max_new_tokens": 32}
        tokenizer_config = json.loads(Path(destination, "tokenizer_config.json").read_text())
        assert tokenizer_config["tokenizer_class"] == "LlamaTokenizer" and tokenizer_config["bos_token"] == "<s>"


def test_a_model_template_has_everything_but_the_weights(toy, tmp_path):
    export_hf(tmp_path / "weights" / "model", toy.config, None, tokenizer_source=str(STORIES))
    assert sorted(p.name for p in (tmp_path / "weights" / "model").iterdir()) == [
        "config.json", "generation_config.json", "tokenizer.model", "tokenizer_config.json"]
    with pytest.raises(ValueError, match="no model.safetensors"):
        from_pretrained(tmp_path / "weights" / "model")


def test_a_transformers_tokenizer_reads_the_exported_sentencepiece_model(toy, tmp_path):
    transformers = pytest.importorskip("transformers")
    export_hf(tmp_path / "out", toy.config, toy.params, tokenizer_source=str(STORIES))
    ours = load_tokenizer(tmp_path / "out")
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path / "out"), use_fast=False)
    text = "Once upon a time, there was a little girl."
    assert theirs(text)["input_ids"] == ours.encode(text, add_bos=True)


def test_without_tokenizer_files_the_export_says_what_is_missing(toy, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        export_hf(tmp_path / "out", toy.config, toy.params, tokenizer_source=str(tmp_path / "empty"))


def test_policy_sources_parse_prefixes_versions_and_plain_paths(tmp_path):
    source = parse_policy_source("weights:gs://b/run/weights@12")
    assert (source.kind, source.path, source.version) == ("weights", "gs://b/run/weights", 12)
    source = parse_policy_source("checkpoint:runs/x/checkpoints")
    assert (source.kind, source.path, source.version, source.template) == (
        "checkpoint", "runs/x/checkpoints", None, "runs/x/checkpoints/model")
    assert parse_policy_source(str(STORIES)).kind == "model"
    (tmp_path / "store" / "committed").mkdir(parents=True)
    assert parse_policy_source(str(tmp_path / "store")).kind == "weights"
    with pytest.raises(ValueError, match="no model template"):
        load_policy(f"weights:{tmp_path / 'store'}")


def test_a_weight_version_on_gs_loads_through_its_template(toy, gcs_emulator):
    from rlax_core.weights import WeightStore, WeightStoreConfig

    root = f"{gcs_emulator.make_bucket()}/run/weights"
    with WeightStore(WeightStoreConfig(root=root, run_id="gs-run")) as store:
        store.publish(4, toy.params)
    export_hf(f"{root}/model", toy.config, None, tokenizer_source=str(STORIES))
    for spec in (f"weights:{root}@4", f"weights:{root}", root):
        np.testing.assert_array_equal(np.asarray(load_policy(spec)(IDS)), np.asarray(toy(IDS)), err_msg=spec)
