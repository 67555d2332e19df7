"""``rlax compile --roles sft,dpo``: the ``rlax sft`` and ``rlax dpo`` steps compiled for the trainer's
chips as the RL trainer's is, with XLA's bytes per chip beside the planner's (``rlax plan
--post-training``). The TPU lane compiles the small Qwen2-shaped recipe's two steps with libtpu on
this host (v5p 2x2x1, FSDP over 4 chips); the default lane checks that the programs are those the jobs
step on (lowered on this host's CPU)."""

from __future__ import annotations

import dataclasses

import jax
import pytest

from rlax_core.compile.programs import trainer_programs
from rlax_core.models.config import toy_config
from rlax_core.models.transformer import init_params
from rlax_core.parallel.config import MeshConfig
from rlax_core.training.config import TrainerConfig
from rlax_core.training.post_config import DpoConfig
from rlax_core.training.preference import PreferenceObjective
from rlax_core.training.supervised import SupervisedObjective
from tests.support.rlax_compile import run_compile

RECIPE = "tests/fixtures/compile/small_qwen2_tpu.yaml"


@pytest.fixture(scope="module")
def post_training(tmp_path_factory):
    return run_compile(tmp_path_factory.mktemp("post-training"), RECIPE, ["--roles", "sft,dpo"])


@pytest.mark.tpu
def test_the_sft_and_dpo_steps_compile_for_the_trainers_slice_beside_the_planners_bytes(post_training):
    programs = {p["role"]: p for p in post_training["programs"]}
    assert sorted(programs) == ["dpo", "sft"]
    for role, program in programs.items():
        assert program["compiled"], program["error"]
        assert (program["program"], program["topology"]) == ("update step", "v5p:2x2x1")
        assert [name for name in program["kernels"] if name.startswith("splash_mqa_dkv")], program["kernels"]
        figures = post_training["roles"][role]
        assert 0.5 < figures["xla_bytes_per_chip"] / figures["planned_bytes_per_chip"] < 1.5, (role, figures)
        assert f"{role}: XLA " in post_training["stdout"]
    sft, dpo = programs["sft"], programs["dpo"]
    # DPO's step holds the frozen reference (an argument: the policy's shape in bfloat16, FSDP over 4
    # chips) and runs two forwards more (the policy's and the reference's totals) than SFT's.
    assert dpo["argument_bytes"] > sft["argument_bytes"]
    assert dpo["flops"] > 1.3 * sft["flops"]


def test_the_compiled_post_training_steps_are_the_ones_the_jobs_take():
    """The programs ``rlax compile`` lowers for ``sft`` and ``dpo`` (from shapes alone) differ from
    each other and from nothing the jobs would not run: DPO with a reference in the step lowers the
    reference's forward, DPO with precomputed reference log-probs reads them with the batch instead."""
    model, devices = toy_config(), jax.devices()[:1]
    config = TrainerConfig(max_seq_len=16, mesh=MeshConfig(fsdp=1))
    lowered = {}
    for name, objective, per_sample in [
            ("sft", SupervisedObjective(), ()), ("dpo-step", PreferenceObjective(DpoConfig()), ()),
            ("dpo-precomputed", PreferenceObjective(DpoConfig(reference="precomputed")), ("reference_logprobs",))]:
        (program,) = trainer_programs(model, objective, config, devices, rows_per_step=8, role=name,
                                      per_sample=per_sample)
        assert (program.role, program.name) == (name, "update step")
        lowered[name] = program.lower()
    arguments = {name: len(jax.tree.leaves(low.args_info)) for name, low in lowered.items()}
    params = len(jax.tree.leaves(jax.eval_shape(lambda: init_params(model, jax.random.key(0)))))
    assert arguments["dpo-step"] == arguments["sft"] + params  # the frozen reference
    assert arguments["dpo-precomputed"] == arguments["sft"] + 1  # its totals with the batch
    with pytest.raises(ValueError, match="dpo: one optimizer update per batch"):
        trainer_programs(model, PreferenceObjective(DpoConfig()), dataclasses.replace(config, mini_batches=2),
                         devices, rows_per_step=8)
