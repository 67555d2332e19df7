"""`rlax launch --config RECIPE --rehearse`: the math and the code recipe end to end on this machine.

Curate, filter, the trainer with the rollout stream for two steps, evaluate: the recipe file as it
is plus the rehearsal's fixed overrides, a tiny random Qwen2 over the real tokenizer, a few real rows,
Prism and the DirectRunner, and every metric and report written to gs:// (the GCS emulator).
"""

import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from pipelines.runners import cached_prism_binary
from rlax_core.data.rollout_store import RolloutStore
from tests.pipelines.gcs_batch_proxy import BatchFixingProxy

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.long,
              pytest.mark.skipif(cached_prism_binary() is None, reason="Prism not built: run `make setup`")]


def _rehearse(recipe, gcs_emulator, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the run's local working state goes under ./runs/rehearse/
    # The jobs see this machine as a user's shell does: one CPU device, not the 8 the test session fakes.
    monkeypatch.setenv("XLA_FLAGS", "")
    bucket_url = gcs_emulator.make_bucket()
    # Beam renames its output shards with GCS batch calls; see gcs_batch_proxy for why they go through it.
    with BatchFixingProxy(gcs_emulator.endpoint) as endpoint:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        assert main(["launch", "--config", str(REPO / "configs" / recipe), "--rehearse",
                     "--output", f"{bucket_url}/rehearsal", "--rows", "4"]) == 0
    bucket = gcs_emulator.client().bucket(bucket_url[len("gs://"):])
    objects = {blob.name for blob in bucket.list_blobs(prefix="rehearsal/")}

    def read(name):
        return bucket.blob(f"rehearsal/{name}").download_as_bytes()

    trainer_steps = [json.loads(line)["step"] for line in read("metrics/metrics.jsonl").decode().splitlines()]
    assert trainer_steps == [1, 2]
    assert [json.loads(line)["step"] for line in read("metrics/loop/metrics.jsonl").decode().splitlines()] == [0, 1]
    assert any(name.startswith("rehearsal/metrics/tensorboard/events.out.tfevents") for name in objects)
    assert json.loads(read("filtered/stats.json"))["kept"] >= 2
    report = json.loads(read("eval/report.json"))
    assert list(report["models"]) == ["tiny_model"]
    assert read("eval/pass_at_k.png")[:4] == b"\x89PNG" and b"| " in read("eval/report.md")
    curated = [row for name in objects if name.startswith("rehearsal/curated/examples-")
               for row in pq.read_table(io.BytesIO(read(name[len("rehearsal/"):]))).to_pylist()]
    assert curated
    state = tmp_path / "runs" / "rehearse"
    run_name = next(p.name for p in state.iterdir())
    store = RolloutStore(str(state / run_name / "state" / "run" / "rollouts"), run_name)
    rows = [row for key in store.list_groups() for row in store.read_group(key).to_pylist()]
    assert {row["policy_version"] for row in rows} <= {0, 1} and len(rows) >= 2 * 2 * 2  # 2 steps x 2 groups x 2
    return [json.loads(row["reward_info"])["terms"]["task"] for row in rows]


def test_the_math_recipe_rehearses_with_rollouts_scored_by_the_math_verifier(gcs_emulator, monkeypatch, tmp_path):
    verdicts = _rehearse("qwen25_7b_math_dataflow_tpu.yaml", gcs_emulator, monkeypatch, tmp_path)
    # The math term's verdict: an extracted answer compared by the verifier, or why there was none.
    assert all("reason" in verdict and "extracted" in verdict for verdict in verdicts)


def test_the_code_recipe_rehearses_with_rollouts_scored_by_the_code_sandbox(gcs_emulator, monkeypatch, tmp_path):
    verdicts = _rehearse("qwq32b_code_tpu_1024.yaml", gcs_emulator, monkeypatch, tmp_path)
    # The code term's verdict: each test of the example run in the sandbox, with its reason.
    assert all(verdict["total"] >= 1 and len(verdict["verdicts"]) == verdict["total"] for verdict in verdicts)
