"""Metrics land where the run says, a local folder or gs:// (the GCS emulator), never in a folder named ``gs:``."""

import json
import math
from pathlib import Path

from rlax_core.utils.metrics import MetricsWriter, read_metrics
from rlax_core.utils.paths import join


def test_metrics_on_gcs_are_objects_in_the_bucket_and_a_restart_continues_them(gcs_emulator, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a Path-mangled "gs:/bucket" would appear here
    bucket = gcs_emulator.make_bucket()
    folder = join(bucket, "runs/r/metrics")
    with MetricsWriter(folder) as writer:
        writer.write(1, {"loss": 0.5, "bad": math.nan})
        writer.write(2, {"loss": 0.25})
    with MetricsWriter(folder) as writer:  # a restarted job appends
        writer.write(3, {"loss": 0.125})
    assert [(r["step"], r["loss"]) for r in read_metrics(folder)] == [(1, 0.5), (2, 0.25), (3, 0.125)]
    assert read_metrics(folder)[0]["bad"] is None
    blobs = {b.name for b in gcs_emulator.client().bucket(bucket[len("gs://"):]).list_blobs(prefix="runs/r/metrics/")}
    assert "runs/r/metrics/metrics.jsonl" in blobs
    assert any(name.startswith("runs/r/metrics/tensorboard/events.out.tfevents") for name in blobs)
    assert not Path("gs:").exists()
    with MetricsWriter(folder, tensorboard=False, resumed_from=2) as writer:  # step 3 is trained again
        writer.write(3, {"loss": 0.1})
    assert [(r["step"], r["loss"]) for r in read_metrics(folder)] == [(1, 0.5), (2, 0.25), (3, 0.1)]


def test_local_metrics_append_and_read_back(tmp_path):
    with MetricsWriter(tmp_path / "m", tensorboard=False) as writer:
        writer.write(0, {"x": 1})
    with MetricsWriter(str(tmp_path / "m"), tensorboard=False) as writer:
        writer.write(1, {"x": 2})
    assert [json.loads(line)["x"] for line in (tmp_path / "m" / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert [r["x"] for r in read_metrics(tmp_path / "m")] == [1, 2]
