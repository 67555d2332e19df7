"""`rlax curate` reading from and writing to gs:// (the local GCS emulator)."""

import io
import json

import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from tests.pipelines.gcs_batch_proxy import BatchFixingProxy


def _line(question, answer="7"):
    return json.dumps({"question": question, "answer": f"Work.\n#### {answer}"})


@pytest.mark.slow
def test_curate_reads_and_writes_gs(gcs_emulator, monkeypatch):
    # Beam renames its output shards with GCS batch calls; see gcs_batch_proxy for why they go through it.
    with BatchFixingProxy(gcs_emulator.endpoint) as endpoint:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", endpoint)
        _curate_on_gcs(gcs_emulator)


def _curate_on_gcs(gcs_emulator):
    bucket_url = gcs_emulator.make_bucket()
    bucket = gcs_emulator.client().bucket(bucket_url[len("gs://"):])
    leak = "Find how many ways twelve identical candies can be shared among three children when each child gets at least two."
    train = [_line("What is 6 times 7?", "42"), _line("What is 6 times 7?", "42"), _line("Read this. " + leak),
             _line("How many legs do 3 spiders have?", "24"), '{"question": ']
    bucket.blob("raw/train.jsonl").upload_from_string("\n".join(train) + "\n")
    bucket.blob("eval/test.jsonl").upload_from_string(_line(leak) + "\n")

    assert main(["curate", "--input", f"{bucket_url}/raw/train.jsonl", "--format", "gsm8k",
                 "--decontaminate-against", f"{bucket_url}/eval/test.jsonl", "--output", f"{bucket_url}/curated"]) == 0

    stats = json.loads(bucket.blob("curated/stats.json").download_as_bytes())
    assert {k: stats[k] for k in ("input", "kept", "duplicate", "contaminated", "dead_lettered")} == {
        "input": 5, "kept": 2, "duplicate": 1, "contaminated": 1, "dead_lettered": 1}
    names = sorted(blob.name for blob in bucket.list_blobs(prefix="curated/"))
    shards = [n for n in names if n.startswith("curated/examples-") and n.endswith(".parquet")]
    assert shards and any(n.startswith("curated/dead_letter-") and n.endswith(".jsonl") for n in names)
    prompts = sorted(p for shard in shards
                     for p in pq.read_table(io.BytesIO(bucket.blob(shard).download_as_bytes())).column("prompt").to_pylist())
    assert prompts == ["How many legs do 3 spiders have?", "What is 6 times 7?"]
