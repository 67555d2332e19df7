"""``model.upcycle``: a run that starts from a dense model upcycled into a mixture of experts, made once
in the run folder and reused (``pipelines.initial_policy``); bad settings refused in one line."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest

from pipelines.config import load_run_config, policy_shape
from pipelines.initial_policy import RECORD, prepare_policy, write_upcycled
from pipelines.plan import memory_plans
from pipelines.run_folder import claim, release
from rlax_core.config import ConfigError
from rlax_core.models import from_pretrained, toy_config
from rlax_core.models.export import export_hf
from rlax_core.models.transformer import init_params

REPO = Path(__file__).resolve().parents[2]
MOE_RECIPE = REPO / "configs" / "quickstart_moe.yaml"
DENSE_RECIPE = REPO / "configs" / "quickstart.yaml"


def moe_config(output: Path, *overrides: str):
    return load_run_config(MOE_RECIPE, [f"run.output_dir={output}", *overrides])


@pytest.mark.parametrize("overrides, path, says", [
    (["model.upcycle.experts_per_token=5"], "model.upcycle.experts_per_token", "1 to num_experts=4 experts, got 5"),
    (["model.upcycle.experts_per_token=0"], "model.upcycle.experts_per_token", "got 0"),
    (["model.upcycle.num_experts=1", "model.upcycle.experts_per_token=1"], "model.upcycle.num_experts",
     "a mixture needs >= 2 experts"),
    (["model.upcycle.noise=-0.1"], "model.upcycle.noise", ">= 0"),
    (["model.upcycle.top_k=2"], "model.upcycle.top_k", "unknown key; allowed: experts_per_token, noise, num_experts, seed"),
    (["model.path=weights:runs/x/weights"], "model.upcycle", "not a weight store, checkpoint or adapter"),
])
def test_bad_upcycle_settings_are_refused_naming_the_key(tmp_path, overrides, path, says):
    with pytest.raises(ConfigError) as caught:
        moe_config(tmp_path, *overrides)
    assert caught.value.path == path, str(caught.value)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_only_a_dense_llama_is_upcycled_and_the_config_says_so_when_loaded(tmp_path):
    qwen = toy_config()  # Qwen2: its q/k/v biases have no place in Mixtral
    export_hf(tmp_path / "qwen", qwen, init_params(qwen, jax.random.key(0)),
              tokenizer_source=REPO / "pipelines" / "assets" / "stories260K")
    with pytest.raises(ConfigError, match=r"^model.upcycle: model.path .*qwen: upcycling takes a dense Llama-family "
                                          r"model .*, not qwen2$"):
        moe_config(tmp_path / "run", f"model.path={tmp_path / 'qwen'}")
    # An upcycled folder is a mixture already: upcycling it again is refused the same way.
    made = prepare_policy(moe_config(tmp_path / "run"))
    with pytest.raises(ConfigError, match="not mixtral with experts"):
        moe_config(tmp_path / "again", f"model.path={made}")


def test_the_policys_shape_is_the_mixtures_before_it_is_written(tmp_path):
    """The planner (and rlax compile and fleet) see the experts before any folder exists."""
    config = moe_config(tmp_path)
    shape = policy_shape(config)
    assert not (tmp_path / "upcycled_model").exists()
    dense = policy_shape(load_run_config(DENSE_RECIPE))
    assert (shape.architecture, shape.moe.num_experts, shape.moe.experts_per_token) == ("mixtral", 4, 2)
    assert dense.moe is None and dense.num_params < shape.num_active_params < shape.num_params
    trainer = {plan.role: plan for plan in memory_plans(config)}["trainer"]
    dense_trainer = {plan.role: plan for plan in memory_plans(load_run_config(DENSE_RECIPE))}["trainer"]
    assert trainer.total > dense_trainer.total  # every expert's weights and optimizer state counted


def test_a_dense_runs_policy_is_its_model_path_and_nothing_is_written(tmp_path):
    config = load_run_config(DENSE_RECIPE, [f"run.output_dir={tmp_path}"])
    assert prepare_policy(config) == config.policy_path() == config.model.resolved_path()
    assert list(tmp_path.iterdir()) == []


def test_the_upcycled_policy_is_made_once_in_the_run_folder_and_reused(tmp_path):
    config = moe_config(tmp_path / "run")
    path = prepare_policy(config)
    assert Path(path) == tmp_path / "run" / "upcycled_model" == Path(config.policy_path())
    model = from_pretrained(path)
    assert model.config.architecture == "mixtral" and model.config.moe.num_experts == 4
    gate = np.asarray(model.params["layers"]["moe"]["gate_proj"])
    assert not np.array_equal(gate[:, 0], gate[:, 1])  # the noise made the experts differ
    assert json.loads((Path(path) / RECORD).read_text()) == {
        "source": "assets:stories260K", "num_experts": 4, "experts_per_token": 2, "noise": 0.01, "seed": 0}
    files = {p.name: p.stat().st_mtime_ns for p in Path(path).iterdir()}

    # A resumed run (another process: a fresh config from the same recipe) reads the same folder, untouched.
    assert prepare_policy(moe_config(tmp_path / "run")) == path
    assert {p.name: p.stat().st_mtime_ns for p in Path(path).iterdir()} == files
    # A job that lost the race to make it (two jobs started together) keeps the one there and leaves no staging.
    write_upcycled(config.model, path, {"lost": "race"})
    assert {p.name: p.stat().st_mtime_ns for p in Path(path).iterdir()} == files
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["upcycled_model"]


def test_a_run_folder_upcycled_with_other_settings_is_refused(tmp_path):
    prepare_policy(moe_config(tmp_path))
    with pytest.raises(ConfigError, match=r"^model.upcycle: .*upcycled_model was upcycled from .*seed=0, and this "
                                          r"config asks for .*seed=1; resume with the settings it was made with"):
        prepare_policy(moe_config(tmp_path, "model.upcycle.seed=1"))
    (tmp_path / "upcycled_model" / RECORD).unlink()  # not made by a run (or by hand): refused, never trained on
    with pytest.raises(ConfigError, match=f"holds no {RECORD}: this run did not make it"):
        prepare_policy(moe_config(tmp_path))


def test_a_folder_holding_only_the_upcycled_policy_holds_no_run_yet(tmp_path):
    """The quickstart makes the policy in its run folder before it launches the run there."""
    prepare_policy(moe_config(tmp_path))
    assert claim(tmp_path, resume=False) is False
    release(tmp_path)
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(ConfigError, match=r"already holds a run \(checkpoints\)"):
        claim(tmp_path, resume=False)


def test_on_gcs_the_policy_is_made_once_and_a_write_cut_short_is_made_again(gcs_emulator):
    from rlax_core.utils.storage import open_storage

    output = f"{gcs_emulator.make_bucket()}/run"
    config = load_run_config(MOE_RECIPE, [f"run.output_dir={output}"])
    path = prepare_policy(config)
    assert path == f"{output}/upcycled_model" and from_pretrained(path).config.moe.num_experts == 4
    storage = open_storage(path)
    assert json.loads(storage.read(RECORD))["seed"] == 0 and prepare_policy(config) == path
    storage.delete(RECORD)  # the weights landed, the record did not: made again, not refused
    assert prepare_policy(config) == path and storage.exists(RECORD)
    with pytest.raises(ConfigError, match="was upcycled from .*seed=0, and this config asks for .*seed=1"):
        prepare_policy(load_run_config(MOE_RECIPE, [f"run.output_dir={output}", "model.upcycle.seed=1"]))
