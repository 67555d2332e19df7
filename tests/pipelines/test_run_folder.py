"""A run folder belongs to one run, checked before the heavy imports; recipes found by name; ``--version``."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlax_core.config import ConfigError
from pipelines.config import CONFIG_DIR, find_config, recipes
from pipelines.quickstart import markdown, policy_line, policy_summary
from rlax_core.models import from_pretrained
from pipelines.run_folder import LOCK_NAME, claim

REPO = Path(__file__).resolve().parents[2]

# The command must answer before JAX, Beam or the run config are imported: make those imports fail.
BLOCK_HEAVY = """
import sys

class BlockHeavy:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("jax", "apache_beam", "flax", "optax", "orbax"):
            raise ImportError(f"{name} imported before the output folder was checked")

sys.meta_path.insert(0, BlockHeavy())
from pipelines.cli import main
sys.exit(main(sys.argv[1:]))
"""


def rlax_light(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", BLOCK_HEAVY, *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_claim_makes_a_new_folder_and_accepts_an_empty_one(tmp_path):
    assert claim(tmp_path / "new" / "run", resume=False) is False
    # Nothing in it but the run's lock (pipelines.run_folder.LOCK_NAME), which names this process.
    assert [p.name for p in (tmp_path / "new" / "run").iterdir()] == [LOCK_NAME]
    assert claim(tmp_path / "new" / "run", resume=False) is False  # still empty: still a new run


def test_claim_refuses_a_used_folder_unless_resuming(tmp_path):
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(ConfigError, match="already holds a run .*report.json.*--resume"):
        claim(tmp_path, resume=False)
    assert claim(tmp_path, resume=True) is True


def test_claim_refuses_a_file_and_an_unwritable_folder(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        claim(tmp_path / "file", resume=False)
    with pytest.raises(ConfigError, match="cannot write"):
        claim(tmp_path / "file" / "below", resume=False)


@pytest.mark.parametrize("command", ["quickstart", "launch"])
def test_a_used_output_is_refused_before_the_heavy_imports(tmp_path, command):
    used = tmp_path / "used"
    used.mkdir()
    (used / "report.json").write_text("{}")
    done = rlax_light(command, "--output", str(used), cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert "already holds a run" in line and "--resume" in line and "imported before" not in done.stderr


@pytest.mark.parametrize("command", ["quickstart", "launch", "train"])
def test_an_unusable_output_is_reported_at_once(tmp_path, command):
    (tmp_path / "file").write_text("x")
    done = rlax_light(command, "--output", str(tmp_path / "file" / "out"), cwd=tmp_path)
    assert done.returncode == 2 and "cannot write" in done.stderr and "imported before" not in done.stderr, done.stderr


def test_version(tmp_path):
    done = rlax_light("--version", cwd=tmp_path)  # at once: no subcommand module is loaded
    assert done.returncode == 0 and done.stdout.startswith("rlax ") and str(REPO / "pipelines") in done.stdout, done


def test_recipes_are_found_by_path_or_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the repository: configs/ here does not exist
    assert find_config("configs/quickstart.yaml") == CONFIG_DIR / "quickstart.yaml"
    assert find_config("quickstart") == find_config("quickstart.yaml") == CONFIG_DIR / "quickstart.yaml"
    (tmp_path / "mine.yaml").write_text("run: {name: mine}\n")
    assert find_config("mine.yaml") == Path("mine.yaml")  # a file of the user's own wins
    with pytest.raises(ConfigError, match="not found: nope.yaml .*quickstart.yaml"):
        find_config("nope.yaml")
    assert "quickstart.yaml" in recipes() and "base.yaml" in recipes()


def test_a_resumed_report_says_so():
    stats = {"prompts": 64, "samples_per_prompt": 8, "pass@1": 0.1, "pass@1_se": 0.01}
    report = {"task": "t", "before": stats, "after": stats, "pass@1_gain_in_se": 0.0, "seconds": {"total": 1.0},
              "rl": {"steps": 2, "groups_per_step": 8, "samples_per_prompt": 8, "max_staleness": 1, "seconds": 1.0},
              "policy": policy_summary(from_pretrained(REPO / "pipelines" / "assets" / "stories260K").config)}
    assert "resumed" not in markdown({**report, "resumed": False})
    assert "This run was resumed (`--resume`)" in markdown({**report, "resumed": True})


def test_the_report_says_whether_the_policy_is_a_mixture(tmp_path):
    from pipelines.config import load_run_config, policy_shape

    dense = policy_summary(policy_shape(load_run_config("quickstart")))
    sparse = policy_summary(policy_shape(load_run_config("quickstart_moe", [f"run.output_dir={tmp_path}"])))
    assert policy_line(dense) == f"llama, {dense['parameters']:,} parameters"
    assert sparse["parameters"] > sparse["active_parameters"] > dense["parameters"]
    assert policy_line(sparse) == (f"mixtral, {sparse['parameters']:,} parameters ({sparse['active_parameters']:,} "
                                   "active per token: 2 of 4 experts per layer)")


def test_shipped_recipes_find_their_models_from_another_folder(tmp_path, monkeypatch):
    """By name, from a folder that is not the repository: the model each recipe names is found."""
    import argparse

    from pipelines import evaluate, filter_difficulty
    from pipelines.inputs import require_model

    monkeypatch.chdir(tmp_path)
    flags = dict(config=None, overrides=[], input="x.jsonl", model=None, samples=None, low=None, high=None, limit=None,
                 output="out", eval_set=[], allow_empty=False)
    filtered, _ = filter_difficulty.resolve_config(argparse.Namespace(**{**flags, "config": "filter_stories260k"}))
    evaluated, _ = evaluate.resolve_config(argparse.Namespace(**{**flags, "config": "evaluate_stories260k", "model": []}))
    for model in (filtered.generation.model, *evaluated.models):
        assert Path(model).is_absolute()
        require_model(model)
