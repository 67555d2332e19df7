"""The batch pipelines' YAML examples load and validate; bad values fail with their key path."""

import argparse
from pathlib import Path

import pytest

from pipelines.config import load_section
from pipelines.curate import resolve_config
from pipelines.evaluate import EvaluateConfig
from pipelines.filter_difficulty import FilterConfig
from rlax_core.config import ConfigError, load_config
from rlax_core.data.curation import CurateConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("section,cls", [("curate", CurateConfig), ("filter", FilterConfig),
                                         ("evaluate", EvaluateConfig)])
def test_example_configs_load(section, cls):
    """A section file (``filter_stories260k.yaml``) or a run config with a ``beam:`` section
    (``filter_dataflow_gpu.yaml``) loads as its command loads it."""
    files = sorted(CONFIGS.glob(f"{section}_*.yaml"))
    assert files
    for path in files:
        assert isinstance(getattr(load_section(path, [], section), section), cls), path


def _curate_args(**kwargs):
    defaults = dict(config=None, overrides=[], input=[], format=[], decontaminate_against=[], output=None)
    return argparse.Namespace(**{**defaults, **kwargs})


def test_curate_reads_the_curate_section_and_beam_options_of_a_run_config():
    config, beam_args = resolve_config(_curate_args(config=str(CONFIGS / "qwen25_7b_math_dataflow_tpu.yaml"),
                                                    overrides=["curate.near_duplicate_threshold=0.7"]))
    assert config.near_duplicate_threshold == 0.7 and len(config.inputs) == 2
    assert "--runner=DataflowRunner" in beam_args


def test_curate_flags_and_errors():
    config, _ = resolve_config(_curate_args(input=["a.jsonl", "b.parquet"], format=["gsm8k", "math"], output="out"))
    assert [(s.path, s.format) for s in config.inputs] == [("a.jsonl", "gsm8k"), ("b.parquet", "math")]
    with pytest.raises(ConfigError, match="--format"):
        resolve_config(_curate_args(input=["a", "b", "c"], format=["gsm8k", "math"], output="out"))
    with pytest.raises(ConfigError, match="near_duplicate_threshold"):
        resolve_config(_curate_args(input=["a"], output="out", overrides=["near_duplicate_threshold=1.5"]))
    with pytest.raises(ConfigError, match=r"inputs\[0\]\.format"):
        load_config(None, ["inputs=[{path: a, format: nope}]"], CurateConfig)
