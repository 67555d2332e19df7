"""Weights & Biases beside TensorBoard: offline mode logs every step with no network and no account."""

from pathlib import Path

import pytest

from rlax_core.config import ConfigError, from_dict
from rlax_core.training.config import TrainerConfig
from rlax_core.utils.wandb_logger import WandbConfig, WandbLogger


def offline_run_file(metrics_dir: Path) -> Path:
    runs = sorted((metrics_dir / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1, f"one offline run under {metrics_dir}/wandb, found {runs}"
    return runs[0]


def test_offline_run_holds_the_logged_scalars(tmp_path):
    logger = WandbLogger(WandbConfig(enabled=True, name="t"), metrics_dir=str(tmp_path), run_config={"seed": 3})
    for step in (1, 2, 3):
        logger.write(step, {"train/loss": 0.5 / step, "train/note": "text", "train/ok": True, "train/nan": None})
    logger.close()
    data = offline_run_file(tmp_path).read_bytes()
    # The run file is wandb's own record log; its history records carry each key and JSON value.
    assert b"train/loss" in data and b"0.16666666666666666" in data and b"0.25" in data
    assert b"train/note" not in data  # only numbers are logged


def test_the_trainer_config_takes_a_wandb_section():
    config = from_dict(TrainerConfig, {"wandb": {"enabled": True, "project": "p", "mode": "online", "tags": ["a"]}})
    assert config.wandb == WandbConfig(enabled=True, project="p", mode="online", tags=("a",))
    assert TrainerConfig().wandb.enabled is False
    with pytest.raises(ConfigError, match="wandb.dir"):
        from_dict(TrainerConfig, {"wandb": {"dir": "gs://bucket/wandb"}})
    with pytest.raises(ConfigError, match="wandb.mode"):
        from_dict(TrainerConfig, {"wandb": {"mode": "cloud"}})
