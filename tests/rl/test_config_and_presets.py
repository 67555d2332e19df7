"""AlgorithmConfig validation, loading from mappings, and the preset registry."""

import dataclasses

import pytest

from rlax_core import rl
from rlax_core.config import ConfigError, apply_overrides, from_dict, to_dict


def test_every_required_preset_is_registered_and_valid():
    assert {"ppo", "grpo", "dapo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "gfpo", "cispo"} <= set(rl.PRESETS)
    for name in rl.PRESETS:
        config = rl.get_preset(name)
        assert isinstance(config, rl.AlgorithmConfig) and config.name == name
        assert from_dict(rl.AlgorithmConfig, to_dict(config)) == config  # YAML round trip
        hash(config)  # static argument of jit


def test_presets_carry_the_published_settings():
    dapo = rl.get_preset("dapo")
    assert (dapo.clip_eps_low, dapo.clip_eps_high, dapo.loss_aggregation) == (0.2, 0.28, "token_mean")
    assert dapo.dynamic_sampling and dapo.kl_coef == 0 and (dapo.overlong_max_length, dapo.overlong_cache_length) == (20480, 4096)
    grpo = rl.get_preset("grpo")
    assert (grpo.kl_coef, grpo.kl_estimator, grpo.loss_aggregation) == (0.04, "k3", "seq_mean_token_mean")
    gspo = rl.get_preset("gspo")
    assert (gspo.importance_ratio, gspo.clip_eps_low, gspo.clip_eps_high) == ("sequence", 3e-4, 4e-4)
    assert rl.get_preset("dr_grpo").loss_aggregation == "seq_sum_norm"
    assert rl.get_preset("cispo").policy_loss == "cispo"
    assert rl.get_preset("ppo").uses_values and not rl.get_preset("grpo").uses_values
    assert rl.get_preset("gfpo").group_filter == "length"


def test_get_preset_applies_and_validates_overrides():
    assert rl.get_preset("dapo", clip_eps_high=0.3).clip_eps_high == 0.3
    with pytest.raises(ConfigError, match="clip_eps_low"):
        rl.get_preset("dapo", clip_eps_low=1.5)
    with pytest.raises(ConfigError, match="unknown algorithm preset 'dapoo'"):
        rl.get_preset("dapoo")


def test_algorithm_from_a_yaml_section_with_dotted_overrides():
    section = apply_overrides({"algorithm": {"preset": "gspo"}}, ["algorithm.kl_coef=0.01", "algorithm.mismatch_correction=tis"])
    config = rl.algorithm_from_dict(section["algorithm"])
    assert (config.name, config.importance_ratio, config.kl_coef, config.mismatch_correction) == ("gspo", "sequence", 0.01, "tis")
    with pytest.raises(ConfigError, match=r"algorithm\.clip_eps: unknown key"):
        rl.algorithm_from_dict({"preset": "grpo", "clip_eps": 0.1})
    with pytest.raises(ConfigError, match=r"algorithm\.preset: unknown algorithm preset"):
        rl.algorithm_from_dict({"preset": "nope"})
    with pytest.raises(ConfigError, match=r"algorithm\.loss_aggregation: expected one of"):
        rl.algorithm_from_dict({"loss_aggregation": "mean"})


@pytest.mark.parametrize(
    "fields, key",
    [
        ({"advantage_estimator": "nope"}, "advantage_estimator"),
        ({"gamma": 1.5}, "gamma"),
        ({"group_filter": "length"}, "group_filter_keep"),
        ({"group_filter_keep": 4}, "group_filter_keep"),
        ({"overlong_max_length": 10, "overlong_cache_length": 11}, "overlong_cache_length"),
        ({"dual_clip_c": 0.5}, "dual_clip_c"),
        ({"dual_clip_c": 3.0, "policy_loss": "cispo"}, "dual_clip_c"),
        ({"loss_aggregation": "seq_sum_norm"}, "loss_max_length"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"mismatch_low": 3.0, "mismatch_high": 2.0}, "mismatch_high"),
        ({"value_clip_eps": 0.0}, "value_clip_eps"),
    ],
)
def test_invalid_configs_name_the_field(fields, key):
    with pytest.raises(ConfigError) as error:
        rl.AlgorithmConfig(**fields)
    assert error.value.path == key


def test_register_preset_adds_a_named_algorithm():
    name = "test_grpo_with_entropy"
    if name not in rl.PRESETS:

        @rl.register_preset(name)
        def grpo_with_entropy():
            return dataclasses.replace(rl.get_preset("grpo"), name=name, entropy_coef=1e-3)

    assert rl.algorithm_from_dict({"preset": name}).entropy_coef == 1e-3
    with pytest.raises(ValueError, match="already registered"):
        rl.register_preset(name)(lambda: rl.AlgorithmConfig())
