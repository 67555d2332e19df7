"""LoRA adapters out as a Hugging Face PEFT folder (and back), and a merged full folder beside it."""

import shutil

import jax
import numpy as np
import pytest

from rlax_core.models import Model, init_params, save_pretrained, toy_config
from rlax_core.models.lora import init_adapters, merge
from rlax_core.models.lora_config import LoraConfig
from rlax_core.models.lora_export import PEFT_CONFIG, PEFT_WEIGHTS, export_peft, load_peft

CONFIG = toy_config()
LORA = LoraConfig(rank=4, alpha=8.0)


def random_tree(tree, seed, scale):
    leaves, structure = jax.tree.flatten(tree)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(structure, [np.asarray(x + scale * jax.random.normal(k, x.shape))
                                          for x, k in zip(leaves, keys)])


def base_and_adapters():
    base = random_tree(init_params(CONFIG, jax.random.key(0)), 1, 0.1)  # random norms and biases matter too
    return base, random_tree(init_adapters(CONFIG, LORA, jax.random.key(2)), 3, 0.05)


def test_peft_folder_round_trips_exactly(tmp_path):
    _, adapters = base_and_adapters()
    names = export_peft(tmp_path / "adapter", CONFIG, LORA, adapters, base_model="base")
    assert names == [PEFT_WEIGHTS, PEFT_CONFIG]
    lora, loaded = load_peft(tmp_path / "adapter", CONFIG)
    assert lora == LORA
    jax.tree.map(np.testing.assert_array_equal, loaded, adapters)


@pytest.mark.slow
def test_peft_loads_our_adapters_onto_the_base_and_the_merged_export_equals_it(tmp_path):
    torch = pytest.importorskip("torch", reason="install the bench extra: torch, transformers, peft")
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    base, adapters = base_and_adapters()
    save_pretrained(Model(CONFIG, base), tmp_path / "base")
    export_peft(tmp_path / "adapter", CONFIG, LORA, adapters, base_model=str(tmp_path / "base"))
    merged = merge(base, adapters, LORA)
    save_pretrained(Model(CONFIG, jax.tree.map(np.asarray, merged)), tmp_path / "merged")

    def load(folder):
        return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                                 attn_implementation="eager").eval()

    with_adapter = peft.PeftModel.from_pretrained(load(tmp_path / "base"), str(tmp_path / "adapter")).eval()
    ids = np.random.default_rng(0).integers(0, CONFIG.vocab_size, (2, 24))
    with torch.inference_mode():
        theirs = with_adapter(torch.from_numpy(ids)).logits.numpy()
        merged_theirs = load(tmp_path / "merged")(torch.from_numpy(ids)).logits.numpy()
        base_theirs = load(tmp_path / "base")(torch.from_numpy(ids)).logits.numpy()
    ours = np.asarray(Model(CONFIG, merged)(ids))
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
    np.testing.assert_allclose(merged_theirs, theirs, atol=1e-4, rtol=0)
    assert np.abs(base_theirs - theirs).max() > 1e-2  # the adapters change the logits that agree


def test_evaluate_and_generate_take_a_peft_folder_or_an_adapter_version(tmp_path):
    from rlax_core.policy.source import load_policy, parse_policy_source
    from rlax_core.weights import WeightStore, WeightStoreConfig
    from rlax_core.weights.adapters import publish_adapters

    base, adapters = base_and_adapters()
    merged = jax.tree.map(np.asarray, merge(base, adapters, LORA))
    save_pretrained(Model(CONFIG, base), tmp_path / "base")
    export_peft(tmp_path / "adapter", CONFIG, LORA, adapters, base_model=str(tmp_path / "base"))
    assert parse_policy_source(str(tmp_path / "adapter")).kind == "adapter"
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                 load_policy(str(tmp_path / "adapter")).params, merged)

    with WeightStore(WeightStoreConfig(root=str(tmp_path / "weights"), run_id="r")) as store:
        store.publish(0, base)
        publish_adapters(store, 1, adapters, base_version=0, lora=LORA)
    (tmp_path / "weights" / "model").mkdir()  # the model template rlax train writes beside its versions
    shutil.copyfile(tmp_path / "base" / "config.json", tmp_path / "weights" / "model" / "config.json")
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
                 load_policy(f"weights:{tmp_path / 'weights'}@1").params, merged)
