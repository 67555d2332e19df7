"""``hf:NAME[:CONFIG]:SPLIT`` inputs: read through ``datasets``' cache in row ranges that Beam spreads over workers.

No network here, so the dataset is a local folder laid out as a Hub dataset is (gsm8k's own layout:
parquet files and a README whose ``configs:`` metadata names the ``main`` and ``socratic`` configs);
``datasets.load_dataset`` reads it through the same builder and cache as it reads ``openai/gsm8k``.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.data.curation import InputSpec, eval_set_name
from transforms.examples import ToExamples
from transforms.io import ReadRawRecords, hf_dataset, hf_shards, parse_hf_path

ROWS = 10


@pytest.fixture
def gsm8k_like(tmp_path, monkeypatch):
    import datasets

    cache = tmp_path / "hf_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)  # what HF_DATASETS_CACHE sets at import
    hf_dataset.cache_clear()
    yield write_gsm8k_like(tmp_path / "gsm8k_like"), cache
    hf_dataset.cache_clear()


def write_gsm8k_like(root: Path) -> Path:
    for config, marker in (("main", "####"), ("socratic", "#### (socratic)")):
        for split, size in (("train", 3), ("test", ROWS)):
            (root / config).mkdir(parents=True, exist_ok=True)
            rows = [{"question": f"{config} {split} {i}: what is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}
                    for i in range(size)]
            if split == "test":
                rows[7]["answer"] = "no final answer"  # a bad row, to be dead-lettered with its row number
            pq.write_table(pa.Table.from_pylist(rows), root / config / f"{split}-00000-of-00001.parquet")
    (root / "README.md").write_text(textwrap.dedent("""\
        ---
        configs:
        - config_name: main
          data_files:
          - {split: train, path: main/train-*.parquet}
          - {split: test, path: main/test-*.parquet}
        - config_name: socratic
          data_files:
          - {split: train, path: socratic/train-*.parquet}
          - {split: test, path: socratic/test-*.parquet}
        ---
        """))
    return root


def test_names_configs_and_splits_parse():
    assert eval_set_name(InputSpec(path="hf:openai/gsm8k:main:test")) == "gsm8k/test"
    assert eval_set_name(InputSpec(path="hf:gsm8k")) == "gsm8k/train"
    assert parse_hf_path("hf:openai/gsm8k:main:test") == ("openai/gsm8k", "main", "test")
    assert parse_hf_path("hf:my_org/data:validation") == ("my_org/data", None, "validation")
    assert parse_hf_path("hf:gsm8k") == ("gsm8k", None, "train")
    for bad in ("hf:", "hf:a:b:c:d", "hf:gsm8k::test"):
        with pytest.raises(ValueError, match="write hf:NAME"):
            parse_hf_path(bad)


def test_a_config_and_split_are_read_in_row_ranges_through_the_cache(gsm8k_like, pipeline):
    root, cache = gsm8k_like
    path = f"hf:{root}:main:test"
    assert list(hf_shards(path, 4)) == [(path, 0, 4), (path, 4, 8), (path, 8, 10)]  # work units, not the dataset
    assert list(cache.rglob("*.arrow")), "datasets prepared the split in the configured cache"
    with pipeline as p:
        examples, dead = (p | ReadRawRecords(path, hf_rows_per_shard=4)
                          | ToExamples(InputSpec(path=path, format="gsm8k", split="test"), 1 << 20))
        assert_that(examples | beam.Map(lambda e: (e["prompt"].split(":")[0], e["answer"])),
                    equal_to([(f"main test {i}", str(i + 1)) for i in range(ROWS) if i != 7]), label="rows")
        assert_that(dead | beam.Map(lambda d: (d["reason"], d["origin"], d["row"])),
                    equal_to([("unparseable_answer", path, 7)]), label="dead")


def test_another_config_is_another_dataset(gsm8k_like, pipeline):
    root, _ = gsm8k_like
    with pipeline as p:
        rows = p | ReadRawRecords(f"hf:{root}:socratic:train") | beam.Map(lambda raw: (raw["row"], raw["record"]["question"]))
        assert_that(rows, equal_to([(i, f"socratic train {i}: what is {i} + 1?") for i in range(3)]))


@pytest.mark.slow  # a curate job in its own process: about 30 s
def test_rlax_curate_reads_a_dataset_config_through_the_cache_named_by_the_environment(tmp_path):
    root = write_gsm8k_like(tmp_path / "gsm8k_like")
    cache, out = tmp_path / "env_cache", tmp_path / "curated"
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    result = subprocess.run([sys.executable, "-m", "pipelines.cli", "curate", "--input", f"hf:{root}:main:test",
                             "--format", "gsm8k", "--output", str(out), "--runner", "FnApiRunner"],
                            env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert list(cache.rglob("*.arrow")), "the split was prepared in HF_DATASETS_CACHE"
    stats = json.loads((out / "stats.json").read_text())
    assert stats["kept"] == ROWS - 1
    dead = [json.loads(line) for f in out.glob("dead_letter-*.jsonl") for line in f.read_text().splitlines()]
    assert [(d["reason"], d["origin"], d["row"]) for d in dead] == [("unparseable_answer", f"hf:{root}:main:test", 7)]
