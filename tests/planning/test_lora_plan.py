"""The planner's LoRA trainer: its adapter and optimizer bytes are what the trainer places per device."""

import dataclasses

import jax
import pytest

from rlax_core.models.config import ModelConfig
from rlax_core.models.lora_config import LoraConfig
from rlax_core.parallel.mesh import make_mesh
from rlax_core.planning.hardware import SliceSpec
from rlax_core.planning.memory import plan_trainer
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.training.config import MeshConfig, TrainerConfig
from rlax_core.training.step import Trainer
from tests.support.device_bytes import bytes_on


@pytest.mark.skipif(jax.local_device_count() < 4, reason="needs 4 devices (tests/conftest.py)")
def test_the_lora_plan_counts_what_the_trainer_places_and_no_reference_copy():
    model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                        num_kv_heads=4, head_dim=8)
    config = TrainerConfig(max_seq_len=16, mesh=MeshConfig(fsdp=2, tensor=2), lora=LoraConfig(rank=4, targets=("q", "o", "up")))
    devices = jax.local_devices()[:4]
    trainer = Trainer(model, AlgorithmConfig(kl_coef=0.1), config, make_mesh(config.mesh, devices))
    state = trainer.init_state()
    plan = plan_trainer(model, config, SliceSpec(chip="cpu", chips_per_host=4, memory_gib=1), rows_per_step=8,
                        uses_reference=True)
    assert plan.parts["adapters"] == bytes_on(devices[0], jax.tree.leaves(state.params))
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    assert plan.parts["optimizer state"] == bytes_on(devices[0], moments)
    assert plan.parts["parameters"] == bytes_on(devices[0], jax.tree.leaves(trainer.base))
    assert "reference policy" not in plan.parts  # the frozen base is the reference
    full = plan_trainer(model, TrainerConfig(max_seq_len=16, mesh=config.mesh),
                        SliceSpec(chip="cpu", chips_per_host=4, memory_gib=1), rows_per_step=8, uses_reference=True)
    assert plan.total < full.total


@pytest.mark.skipif(jax.local_device_count() < 4, reason="needs 4 devices (tests/conftest.py)")
def test_the_qlora_plan_counts_the_int8_base_the_trainer_holds_and_no_merged_kernels():
    model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                        num_kv_heads=4, head_dim=8)
    mesh = MeshConfig(fsdp=2, tensor=2)
    hardware = SliceSpec(chip="cpu", chips_per_host=4, memory_gib=1)
    config = TrainerConfig(max_seq_len=16, mesh=mesh, lora=LoraConfig(rank=4, base_dtype="int8"))
    devices = jax.local_devices()[:4]
    trainer = Trainer(model, AlgorithmConfig(), config, make_mesh(mesh, devices))
    trainer.init_state()
    plan = plan_trainer(model, config, hardware, rows_per_step=8)
    assert plan.parts["parameters"] == bytes_on(devices[0], jax.tree.leaves(trainer.base))
    assert "merged kernels" not in plan.parts
    float_base = plan_trainer(model, TrainerConfig(max_seq_len=16, mesh=mesh, lora=LoraConfig(rank=4)), hardware,
                              rows_per_step=8)
    assert plan.parts["parameters"] < float_base.parts["parameters"]  # int8 kernels (embeddings stay float32)
    dropout = plan_trainer(model, TrainerConfig(max_seq_len=16, mesh=mesh, lora=LoraConfig(rank=4, dropout=0.1)),
                           hardware, rows_per_step=8)
    assert "merged kernels" not in dropout.parts and "merged kernels" in float_base.parts


def test_an_int8_lora_trainer_fits_qwq32b_on_4_v5p_chips_where_full_fine_tuning_needs_16():
    from pipelines.config import load_run_config
    from pipelines.plan import memory_plans

    def trainer_plan(hosts, tensor, *lora):
        fsdp = hosts * 4 // tensor
        overrides = [f"hardware.trainer.hosts={hosts}", f"trainer.mesh.fsdp={fsdp}", f"trainer.mesh.tensor={tensor}",
                     f"trainer.micro_batches={8192 // fsdp}", *lora]  # one 32k-token row per chip per micro-batch
        config = load_run_config("configs/qwq32b_code_tpu_1024.yaml", overrides)
        return next(plan for plan in memory_plans(config) if plan.role == "trainer")

    bf16 = ("trainer.lora.rank=32", "trainer.lora.alpha=64")
    qlora = (*bf16, "trainer.lora.base_dtype=int8")
    assert trainer_plan(4, 8).fits and not trainer_plan(2, 8).fits and not trainer_plan(1, 4).fits
    assert trainer_plan(1, 4, *qlora).fits and not trainer_plan(1, 4, *bf16).fits  # docs/lora.md's table
    assert "merged kernels" not in trainer_plan(1, 4, *qlora).parts


@pytest.mark.parametrize("remat", [True, False])
def test_on_the_fly_adapters_activations_are_x_times_a_per_adapted_projection_and_token(remat):
    model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=3, num_heads=8,
                        num_kv_heads=4, head_dim=8)
    hardware = SliceSpec(chip="cpu", chips_per_host=4, memory_gib=1)
    lora = LoraConfig(rank=4, targets=("q", "o", "down"), base_dtype="int8")
    config = TrainerConfig(max_seq_len=16, remat=remat, micro_batches=2, mesh=MeshConfig(fsdp=2, tensor=2), lora=lora)
    plan = plan_trainer(model, config, hardware, rows_per_step=16)
    # 16 rows / (2 micro-batches x fsdp 2) = 4 rows per chip; x @ A is float32 [4, 16, rank 4] for each of
    # the 3 projections, whole on each chip: 4 * 16 * 4 * 3 * 4 B = 3072 B per layer; 3 layers without
    # remat, the one recomputed layer with it.
    assert plan.parts["adapter activations"] == (3072 if remat else 3 * 3072)
    for merged in (LoraConfig(rank=4, targets=lora.targets), None):  # merged kernels, full fine-tuning: none
        other = dataclasses.replace(config, lora=merged or LoraConfig())
        assert "adapter activations" not in plan_trainer(model, other, hardware, rows_per_step=16).parts
    dropout = dataclasses.replace(config, lora=LoraConfig(rank=8, targets=lora.targets, dropout=0.1))
    assert plan_trainer(model, dropout, hardware, rows_per_step=16).parts["adapter activations"] == 2 * (
        3072 if remat else 3 * 3072)  # rank 8: twice


def test_the_lora_recipe_trains_qwq32b_on_one_v5p_host_where_its_full_fine_tuning_does_not_fit():
    from pipelines.config import load_run_config
    from pipelines.plan import memory_plans

    def trainer_plan(*overrides):
        config = load_run_config("configs/qwq32b_code_lora_tpu.yaml", overrides)
        return next(plan for plan in memory_plans(config) if plan.role == "trainer")

    recipe = load_run_config("configs/qwq32b_code_lora_tpu.yaml")
    assert (recipe.trainer.lora.rank, recipe.trainer.lora.base_dtype, recipe.hardware.trainer.chips) == (32, "int8", 4)
    assert recipe.trainer.groups_per_step * recipe.loop.sampling.samples_per_prompt == recipe.trainer.micro_batches  # 1 row each
    lora = trainer_plan()
    assert lora.fits and lora.parts["adapter activations"] > 0
    assert not trainer_plan("trainer.lora.rank=0").fits  # full fine-tuning of the same model on the same chips


@pytest.mark.skipif(jax.local_device_count() < 4, reason="needs 4 devices (tests/conftest.py)")
@pytest.mark.parametrize("tensor_parallel", [1, 4])
def test_an_engine_on_the_fly_holds_the_planned_adapters_and_its_prefill_the_planned_x_times_a(tensor_parallel):
    from rlax_core.inference.config import EngineConfig
    from rlax_core.inference.engine import Engine
    from rlax_core.models.lora import init_adapters
    from rlax_core.models.transformer import init_params
    from rlax_core.planning.memory import plan_rollout

    model = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=8,
                        num_kv_heads=4, head_dim=8)
    lora = LoraConfig(rank=4, targets=("q", "v", "o", "gate", "down"))  # q and v but not k: fused zero blocks
    config = EngineConfig(num_slots=2, page_size=4, num_pages=12, max_prompt_len=8, max_new_tokens=8,
                          prefill_buckets=(8,), max_prefill_batch=2, attention_impl="window",
                          tensor_parallel=tensor_parallel, lora_mode="on_the_fly")
    hardware = SliceSpec(chip="cpu", chips_per_host=4, memory_gib=1)
    devices = jax.local_devices()[:tensor_parallel]
    engine = Engine(config, model, init_params(model, jax.random.key(0)),
                    **({"devices": devices} if tensor_parallel > 1 else {"device": devices[0]}))
    engine.update_adapters(init_adapters(model, lora, jax.random.key(1)), lora, 1)
    held = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(engine.params)
            if "lora_" in jax.tree_util.keystr(path)]
    plan = plan_rollout(model, config, hardware, "float32", lora=lora)
    assert plan.parts["adapters"] == 2 * bytes_on(devices[0], held)  # the version's and the next one's
    # The prefill's x @ A: 2 prompts x bucket 8 x rank 4 x 5 projections x 4 B (float32), one layer at a time.
    assert plan.parts["adapter activations"] == 2 * 8 * 4 * 5 * 4
    merged_config = dataclasses.replace(config, lora_mode="merged")
    merged = plan_rollout(model, merged_config, hardware, "float32", lora=lora)
    engine = Engine(merged_config, model, init_params(model, jax.random.key(0)),
                    **({"devices": devices} if tensor_parallel > 1 else {"device": devices[0]}))
    base = {id(leaf) for leaf in jax.tree.leaves(engine.params)}
    engine.update_adapters(init_adapters(model, lora, jax.random.key(1)), lora, 1)
    new = [leaf for leaf in jax.tree.leaves(engine.params) if id(leaf) not in base]  # beside the base's own
    assert "adapters" not in merged.parts and merged.parts["merged kernels"] == bytes_on(devices[0], new)
    assert "adapters" not in plan_rollout(model, config, hardware, "float32").parts  # not a LoRA run
