"""Every recipe in configs/ loads, and each kind of bad config fails with a precise error."""

import dataclasses
from pathlib import Path
from typing import Literal, Optional

import pytest

from pipelines.config import RunConfig, load_run_config, load_section
from rlax_core.config import ConfigError, from_dict, parse_override, read_yaml, require

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
                                    "algorithm.clip_eps_high=0.3", "engine.prefill_buckets=[8,256]",
                                    "algorithm.overlong_max_length=256", "algorithm.overlong_cache_length=64"])
    assert config.trainer.optimizer.learning_rate == 3e-4
    assert config.algorithm.name == "dapo" and config.algorithm.clip_eps_high == 0.3
    assert config.engine.prefill_buckets == (8, 256)


def test_dapos_overlong_shaping_is_refused_where_it_could_never_apply():
    # The preset's lengths are the paper's (a 20,480-token budget); a run of 256 new tokens must set its own.
    with pytest.raises(ConfigError, match=r"algorithm.overlong_max_length: .* starts past L_max - L_cache = 16384"):
        load_run_config(None, ["algorithm.preset=dapo"])
    with pytest.raises(ConfigError, match="at most 64"):  # the loop's own budget counts, not the engine's
        load_run_config(None, ["algorithm.preset=dapo", "algorithm.overlong_max_length=128",
                               "algorithm.overlong_cache_length=32", "loop.sampling.max_new_tokens=64"])
    assert load_run_config(None, ["algorithm.preset=dapo", "algorithm.overlong_max_length=0"]).algorithm.dynamic_sampling


def test_moved_keys_parse_to_their_new_place_or_say_where_they_went():
    old = load_run_config(None, ["loop.samples_per_prompt=4", "loop.temperature=0.7", "loop.stop_token_ids=[13]",
                                 "filter.generation.samples=3", "filter.generation.max_new_tokens=32"])
    new = load_run_config(None, ["loop.sampling.samples_per_prompt=4", "loop.sampling.temperature=0.7",
                                 "loop.sampling.stop_token_ids=[13]", "filter.generation.sampling.samples_per_prompt=3",
                                 "filter.generation.sampling.max_new_tokens=32"])
    assert old == new
    with pytest.raises(ConfigError, match="set twice, as loop.temperature and as loop.sampling.temperature; "
                                          "write loop.sampling.temperature only"):
        load_run_config(None, ["loop.temperature=0.7", "loop.sampling.temperature=0.9"])
    for key, new_home in [("loop.drop_uniform_groups=true", "algorithm.dynamic_sampling"),
                          ("trainer.startup_wait_s=5", "loop.startup_budget_s"),
                          ("loop.rewards.overlong={max_length: 8}", "algorithm.overlong_max_length")]:
        with pytest.raises(ConfigError, match=new_home) as error:
            load_run_config(None, [key])
        assert "\n" not in str(error.value)  # one line


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


# ----------------------------------------------------------------------------- configs that lie are refused


@pytest.mark.parametrize("text, lines", [
    ("trainer: {total_steps: 3}\ntrainer: {total_steps: 4}\n", "at lines 1 and 2"),  # the case
    ("run:\n  seed: 1\ntrainer:\n  optimizer:\n    learning_rate: 1e-5\n    warmup_steps: 2\n    learning_rate: 1e-4\n",
     "at lines 5 and 7"),  # nested, block style
    ("trainer: {optimizer: {learning_rate: 1e-5, learning_rate: 1e-4}}\n", "twice on line 1"),  # nested, flow style
    ("loop:\n  rewards:\n    terms: {story_word: 1.0}\n    terms: {length: 1.0}\n", "at lines 3 and 4"),
], ids=["top", "nested-block", "nested-flow", "section"])
def test_a_key_given_twice_is_refused_naming_both_lines(tmp_path, text, lines):
    path = tmp_path / "twice.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=f"{path}: duplicate key .* {lines}; YAML would keep the last"):
        load_run_config(path)


def test_a_key_given_twice_is_refused_in_a_base_file_and_in_an_override_value(tmp_path):
    (tmp_path / "parent.yaml").write_text("trainer:\n  total_steps: 7\n  total_steps: 8\n")
    (tmp_path / "child.yaml").write_text("base: parent.yaml\nrun: {seed: 1}\n")
    with pytest.raises(ConfigError, match=r"parent.yaml: duplicate key 'total_steps' at lines 2 and 3"):
        load_run_config(tmp_path / "child.yaml")
    with pytest.raises(ConfigError, match=r"trainer: cannot parse override value .*duplicate key 'total_steps'"):
        load_run_config(None, ["trainer={total_steps: 3, total_steps: 4}"])
    # A key a merge (<<) brings in may be set again: that is what merging is for.
    (tmp_path / "merge.yaml").write_text("defaults: &d {total_steps: 3, groups_per_step: 2}\n"
                                         "trainer:\n  <<: *d\n  total_steps: 5\n")
    assert read_yaml(tmp_path / "merge.yaml")["trainer"] == {"total_steps": 5, "groups_per_step": 2}


def alias_bomb(levels: int = 9) -> str:
    """A few hundred bytes whose aliases expand to 9**levels values (the 'billion laughs')."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_within_a_cpu_second_and_100_mb(tmp_path):
    # The kernel enforces both bounds on the process that reads it: past 1 s of CPU it is killed
    # (SIGXCPU), past 100 MB of address space it cannot allocate. Unbounded, the same file takes
    # minutes and gigabytes to read into a config.
    import resource
    import subprocess
    import sys

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    assert bomb.stat().st_size < 1000
    script = ("import resource; resource.setrlimit(resource.RLIMIT_CPU, (1, 1)); "
              "resource.setrlimit(resource.RLIMIT_AS, (100 << 20, 100 << 20))\n"
              "from rlax_core.config import ConfigError, apply_overrides, read_yaml\n"  # as every config path reads
              f"try:\n    apply_overrides(read_yaml({str(bomb)!r}), [])\nexcept ConfigError as error:\n    print(error)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (f"{bomb}: anchors and aliases expand to more than 100,000 values (line 6); "
                                   "a config holds far fewer")


def test_an_alias_that_holds_itself_is_refused(tmp_path):
    (tmp_path / "loop.yaml").write_text("trainer: &t\n  again: *t\n")
    with pytest.raises(ConfigError, match="an alias refers to a node that holds it"):
        read_yaml(tmp_path / "loop.yaml")


@pytest.mark.parametrize("base, says", [
    ("/dev/zero", "/dev/zero is a character device, not a regular file"),
    ("/dev/null", "/dev/null is a character device, not a regular file"),
    ("{tmp}", "{tmp} is a folder, not a regular file"),
    ("{tmp}/fifo", "{tmp}/fifo is a pipe, not a regular file"),
    ("{tmp}/huge.yaml", "{tmp}/huge.yaml holds 2,097,152 bytes; a config is at most 1,048,576"),
    ("{tmp}/missing.yaml", "config file not found: {tmp}/missing.yaml"),
    ("[a.yaml]", "base: in {tmp}/child.yaml: name the file to inherit from, got list"),
], ids=["dev-zero", "dev-null", "folder", "fifo", "huge", "missing", "not-a-name"])
def test_a_base_that_is_not_a_small_regular_file_is_refused_in_one_line(tmp_path, base, says):
    import os

    os.mkfifo(tmp_path / "fifo")  # a pipe: opening it would block for ever
    (tmp_path / "huge.yaml").write_bytes(b"#" * (2 << 20))
    (tmp_path / "child.yaml").write_text(f"base: {base.replace('{tmp}', str(tmp_path))}\nrun: {{seed: 1}}\n")
    with pytest.raises(ConfigError) as raised:
        load_run_config(tmp_path / "child.yaml")
    assert says.replace("{tmp}", str(tmp_path)) in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize("given", ["/dev/zero", "{tmp}"])
def test_a_config_that_is_a_device_or_a_folder_is_refused_in_one_line(tmp_path, given, capsys):
    from pipelines.cli import main

    given = given.replace("{tmp}", str(tmp_path))
    assert main(["plan", "--config", given]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"rlax plan: config error: config file {given} is a ") and error.count("\n") == 1


def test_a_config_alias_bomb_through_rlax_is_one_line(tmp_path, capsys):
    from pipelines.cli import main

    (tmp_path / "bomb.yaml").write_text(alias_bomb())
    assert main(["plan", "--config", str(tmp_path / "bomb.yaml")]) == 2
    assert capsys.readouterr().err == (f"rlax plan: config error: {tmp_path / 'bomb.yaml'}: anchors and aliases "
                                       "expand to more than 100,000 values (line 6); a config holds far fewer\n")


def test_a_config_with_a_byte_order_mark_reads_as_without(tmp_path):
    (tmp_path / "bom.yaml").write_bytes("\ufefftrainer: {total_steps: 9}\n".encode("utf-8"))
    assert load_run_config(tmp_path / "bom.yaml").trainer.total_steps == 9


def test_sections_nested_past_any_config_are_refused(tmp_path):
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 500 + "]" * 500 + "\n")
    with pytest.raises(ConfigError, match="nested more than 64 levels deep"):
        load_run_config(tmp_path / "deep.yaml")
