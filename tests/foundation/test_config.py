"""Every recipe in configs/ loads, and each kind of bad config fails with a precise error."""

import dataclasses
from pathlib import Path
from typing import Literal, Optional

import pytest

from pipelines.config import RunConfig, load_run_config, load_section
from rlax_core.config import ConfigError, from_dict, parse_override, require

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_there_are_recipes():
    names = {p.name for p in CONFIGS}
    assert {"base.yaml", "quickstart.yaml"} <= names, names
    assert len(CONFIGS) >= 4


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_recipe_loads(path):
    """Run recipes load whole; one-pipeline files (curate_*, filter_*, evaluate_*) as their section."""
    section = path.name.split("_", 1)[0]
    config = load_section(path, [], section) if section in ("curate", "filter", "evaluate") else load_run_config(path)
    assert isinstance(config, RunConfig)
    assert config.algorithm.name != "custom"  # a preset was resolved


def test_one_pipeline_files_are_a_section_of_the_run_tree(tmp_path):
    job = tmp_path / "filter_job.yaml"
    job.write_text("input: a.parquet\noutput: out\nlow: 0.2\n")
    config = load_section(job, ["high=0.5", "trainer.total_steps=3"], "filter")
    assert (config.filter.input, config.filter.low, config.filter.high) == ("a.parquet", 0.2, 0.5)
    assert config.trainer.total_steps == 3
    with pytest.raises(ConfigError) as caught:
        load_section(job, ["low=2"], "filter")
    assert caught.value.path == "filter.low"


def test_overrides_reach_nested_sections():
    config = load_run_config(None, ["trainer.optimizer.learning_rate=3e-4", "algorithm.preset=dapo",
                                    "algorithm.clip_eps_high=0.3", "engine.prefill_buckets=[8,256]"])
    assert config.trainer.optimizer.learning_rate == 3e-4
    assert config.algorithm.name == "dapo" and config.algorithm.clip_eps_high == 0.3
    assert config.engine.prefill_buckets == (8, 256)


@pytest.mark.parametrize(
    "overrides, path, message",
    [
        (["trainer.learning_rat=1"], "trainer.learning_rat", "unknown key; allowed: "),
        (["trainer.total_steps=many"], "trainer.total_steps", "expected an integer, got str 'many'"),
        (["trainer.optimizer.learning_rate=fast"], "trainer.optimizer.learning_rate", "expected a number"),
        (["trainer.remat=3"], "trainer.remat", "expected true or false"),
        (["engine.attention_impl=cuda"], "engine.attention_impl", "expected one of"),
        (["trainer.total_steps=0"], "trainer.total_steps", ">= 1"),
        (["algorithm.preset=sppo"], "algorithm.preset", "unknown algorithm preset 'sppo'"),
        (["run.name=a/b"], "run.name", "without '/'"),
        (["trainer=5"], "trainer", "expected a mapping"),
    ],
)
def test_bad_values_name_the_full_key_path(overrides, path, message):
    with pytest.raises(ConfigError) as caught:
        load_run_config(None, overrides)
    assert caught.value.path == path, str(caught.value)
    assert message in str(caught.value)


@pytest.mark.parametrize("text", ["trainer.total_steps", "=3", "trainer..steps=1", "trainer.total steps=1"])
def test_bad_override_syntax(text):
    with pytest.raises(ConfigError, match="bad override"):
        parse_override(text)


def test_override_into_a_value_is_refused():
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_run_config(None, ["run.seed=1", "run.seed.x=2"])


def test_yaml_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_run_config(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_run_config(tmp_path / "missing.yaml")


def test_base_inheritance(tmp_path):
    (tmp_path / "parent.yaml").write_text("trainer: {total_steps: 7, groups_per_step: 2}\n")
    (tmp_path / "child.yaml").write_text("base: parent.yaml\ntrainer: {total_steps: 9}\n")
    config = load_run_config(tmp_path / "child.yaml")
    assert (config.trainer.total_steps, config.trainer.groups_per_step) == (9, 2)


def test_a_base_cycle_is_one_error_naming_the_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text("base: b.yaml\ntrainer: {total_steps: 9}\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    (tmp_path / "self.yaml").write_text("base: self.yaml\n")
    with pytest.raises(ConfigError, match=r"inheritance cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml") as caught:
        load_run_config(tmp_path / "a.yaml")
    assert caught.value.path == "base" and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match=r"inheritance cycle: .*self\.yaml -> .*self\.yaml"):
        load_run_config(tmp_path / "self.yaml")


@pytest.mark.parametrize("value", ["inf", "-inf", ".inf", "nan", ".nan", "1e999"])
def test_non_finite_numbers_are_refused(value):
    with pytest.raises(ConfigError, match="expected a finite number") as caught:
        load_run_config(None, [f"trainer.optimizer.learning_rate={value}"])
    assert caught.value.path == "trainer.optimizer.learning_rate"
    with pytest.raises(ConfigError, match="expected a finite number"):
        load_run_config(None, [f"algorithm.clip_eps_high={value}"])


def test_an_empty_config_file_is_refused(tmp_path):
    for text in ("", "\n", "# only a comment\n"):
        (tmp_path / "empty.yaml").write_text(text)
        with pytest.raises(ConfigError, match="empty.yaml is empty"):
            load_run_config(tmp_path / "empty.yaml")
        with pytest.raises(ConfigError, match="empty.yaml is empty"):
            load_section(tmp_path / "empty.yaml", [], "filter")


def test_loader_types():
    @dataclasses.dataclass(frozen=True)
    class Inner:
        ratio: float = 0.5

        def __post_init__(self):
            require(0 <= self.ratio <= 1, "ratio", "between 0 and 1")

    @dataclasses.dataclass(frozen=True)
    class Outer:
        mode: Literal["a", "b"] = "a"
        sizes: tuple[int, ...] = ()
        pair: tuple[int, str] = (0, "")
        maybe: Optional[int] = None
        inner: Inner = Inner()

    built = from_dict(Outer, {"mode": "b", "sizes": [1, 2], "pair": [3, "x"], "maybe": None, "inner": {"ratio": 1}})
    assert built == Outer("b", (1, 2), (3, "x"), None, Inner(1.0))
    with pytest.raises(ConfigError, match=r"^inner.ratio: between 0 and 1$"):
        from_dict(Outer, {"inner": {"ratio": 2}})
    with pytest.raises(ConfigError, match=r"^sizes\[1\]: expected an integer"):
        from_dict(Outer, {"sizes": [1, "x"]})
    with pytest.raises(ConfigError, match=r"^pair: expected 2 items"):
        from_dict(Outer, {"pair": [1]})
