import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rlax_core.config import ConfigError, from_dict
from rlax_core.parallel.mesh import make_mesh, mesh_shape, spec_for
from rlax_core.training.config import OptimizerConfig, TrainerConfig
from rlax_core.training.optimizer import learning_rate_schedule


def test_mesh_shapes_fill_the_free_axis():
    cfg = from_dict(TrainerConfig, {"mesh": {"fsdp": 2, "tensor": 4, "data": -1}}).mesh
    assert mesh_shape(cfg, 8) == (1, 2, 1, 1, 4)
    with pytest.raises(ValueError, match="needs 4 devices"):
        mesh_shape(from_dict(TrainerConfig, {"mesh": {"fsdp": 2, "tensor": 2}}).mesh, 8)
    mesh = make_mesh(cfg)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "expert": 1, "context": 1, "tensor": 4}


def test_partition_rules_shard_what_divides_and_replicate_the_rest():
    mesh = make_mesh(from_dict(TrainerConfig, {"mesh": {"fsdp": 2, "tensor": 4}}).mesh)
    assert spec_for(("vocab", "embed"), (256, 64), mesh) == P("tensor", "fsdp")
    assert spec_for(("embed", "kv_heads", "head_dim"), (64, 2, 16), mesh) == P("fsdp", None, None)  # 2 % 4
    assert spec_for(("batch", None), (8, 5), mesh) == P("fsdp", None)  # data axis has size 1
    assert spec_for(("embed", "embed"), (64, 64), mesh) == P("fsdp", None)  # a mesh axis is used once


def test_warmup_then_cosine_and_constant():
    cosine = learning_rate_schedule(OptimizerConfig(learning_rate=1.0, schedule="cosine", warmup_steps=10,
                                                    decay_steps=100, min_lr_ratio=0.1))
    assert float(cosine(0)) == 0.0 and float(cosine(5)) == pytest.approx(0.5)
    assert float(cosine(10)) == pytest.approx(1.0) and float(cosine(110)) == pytest.approx(0.1)
    constant = learning_rate_schedule(OptimizerConfig(learning_rate=2.0, warmup_steps=4))
    assert [float(constant(s)) for s in (0, 2, 4, 1000)] == pytest.approx([0.0, 1.0, 2.0, 2.0])


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"optimizer.learning_rate: must be > 0"):
        from_dict(TrainerConfig, {"optimizer": {"learning_rate": 0}})
    with pytest.raises(ConfigError, match=r"mesh.coordinator_address"):
        from_dict(TrainerConfig, {"mesh": {"coordinator_address": "localhost:1234"}})
