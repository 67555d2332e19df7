"""The planner's LoRA trainer: its adapter and optimizer bytes are what the trainer places per device."""

import jax
import pytest

from rlax_core.models.config import ModelConfig
from rlax_core.models.lora import LoraConfig
from rlax_core.parallel.mesh import make_mesh
from rlax_core.planning.hardware import SliceSpec
from rlax_core.planning.memory import plan_trainer
from rlax_core.rl.config import AlgorithmConfig
from rlax_core.training.config import MeshConfig, TrainerConfig
from rlax_core.training.step import Trainer


def _bytes_on(device, arrays):
    return sum(shard.data.nbytes for array in arrays for shard in array.addressable_shards if shard.device == device)


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
    assert plan.parts["adapters"] == _bytes_on(devices[0], jax.tree.leaves(state.params))
    moments = [x for x in jax.tree.leaves(state.opt_state) if x.ndim > 0]
    assert plan.parts["optimizer state"] == _bytes_on(devices[0], moments)
    assert plan.parts["parameters"] == _bytes_on(devices[0], jax.tree.leaves(trainer.base))
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
    assert plan.parts["parameters"] == _bytes_on(devices[0], jax.tree.leaves(trainer.base))
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

    qlora = ("trainer.lora.rank=32", "trainer.lora.alpha=64", "trainer.lora.base_dtype=int8")
    assert trainer_plan(4, 8).fits and not trainer_plan(2, 8).fits and not trainer_plan(1, 4).fits
    assert trainer_plan(1, 4, *qlora).fits
    assert "merged kernels" not in trainer_plan(1, 4, *qlora).parts
