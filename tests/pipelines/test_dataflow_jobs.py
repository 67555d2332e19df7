"""Every production recipe and every Beam command, translated for the DataflowRunner offline (``--dry_run``).

Each command runs through the real CLI with the recipe unchanged but for its input paths (pointed at
the fixtures, since the recipes name buckets): the printed job must have the runner, the worker
pool and the options Dataflow's documentation asks for, and stay small whatever the data holds.
No socket may leave this machine while it translates.
"""

import json
import socket
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from rlax_core.data.records import EXAMPLE_SCHEMA, make_example, to_table

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "fixtures" / "data"
MODEL = REPO / "pipelines" / "assets" / "stories260K"
RECIPES = {  # recipe -> (accelerator service option, accelerator machine type, worker image)
    "qwen25_7b_math_dataflow_tpu.yaml": ("type:tpu-v5-lite-podslice;topology:2x2", "ct5lp-hightpu-4t", "rlax-worker-tpu"),
    "qwq32b_code_tpu_1024.yaml": ("type:tpu-v6e-slice;topology:2x4", "ct6e-standard-8t", "rlax-worker-tpu"),
    "qwen25_1p5b_math_dataflow_gpu.yaml": ("type:nvidia-l4;count:1;install-nvidia-driver", "g2-standard-8",
                                           "rlax-worker-gpu"),
    "qwen25_1p5b_math_tool_dataflow_gpu.yaml": ("type:nvidia-l4;count:1;install-nvidia-driver", "g2-standard-8",
                                                "rlax-worker-gpu"),
}
CPU_MACHINES = ("n1-", "n2-", "n2d-", "e2-", "c2-", "c3-")
MAX_JOB_BYTES = 1 << 20

INPUTS = {
    "curate": [f"curate.inputs=[{{path: {DATA}/gsm8k/test.jsonl, format: gsm8k}}]",
               f"curate.decontaminate_against=[{{path: {DATA}/aime24/test.jsonl}}]"],
    "filter": [f"filter.input={DATA}/gsm8k/test.jsonl", f"filter.generation.model={MODEL}"],
    "evaluate": [f"evaluate.models=[{MODEL}]", f"evaluate.eval_sets=[{{path: {DATA}/aime24/test.jsonl}}]"],
}


@pytest.fixture
def offline(monkeypatch):
    """Refuse every connection that leaves the machine: translation must need no network and no credentials."""
    connect = socket.socket.connect

    def local_only(sock, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in ("127.0.0.1", "::1", "localhost") and sock.family != socket.AF_UNIX:
            raise OSError(f"dry-run translation tried to reach {address}")
        return connect(sock, address)

    monkeypatch.setattr(socket.socket, "connect", local_only)


@pytest.fixture(scope="module")
def train_sets(tmp_path_factory):
    """Training sets of 100 and 100,000 prompts (parquet, as the difficulty filter writes them)."""
    folder = tmp_path_factory.mktemp("train_sets")
    paths = {}
    for count in (100, 100_000):
        rows = [make_example(source="synthetic", prompt=f"What is {i} plus {i + 1}?", task="math", answer=str(2 * i + 1))
                for i in range(count)]
        paths[count] = folder / f"train_{count}.parquet"
        pq.write_table(to_table(rows, EXAMPLE_SCHEMA), paths[count])
    return paths


def _dry_run(capsys, argv):
    assert main([*argv, "--dry_run=True"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('{"')]
    return json.loads(lines[-1])


def _check_accelerator_job(job, recipe):
    accelerator, machine, image = RECIPES[recipe]
    assert job["runner"] == "DataflowRunner"
    assert job["accelerator"] == accelerator and job["machine_type"] == machine
    assert len(job["container_images"]) == 1 and f"/{image}:" in job["container_images"][0]
    assert "use_runner_v2" in job["experiments"] and "no_use_multiple_sdk_containers" in job["experiments"]
    assert job["size_bytes"] < MAX_JOB_BYTES


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_curate_is_a_cpu_batch_job(recipe, capsys, offline):
    job = _dry_run(capsys, ["curate", "--config", f"configs/{recipe}", *INPUTS["curate"]])
    assert job["dry_run"] == "curate" and job["runner"] == "DataflowRunner" and job["job_type"] == "JOB_TYPE_BATCH"
    assert job["machine_type"].startswith(CPU_MACHINES) and job["accelerator"] is None
    assert not any(o.startswith("worker_accelerator") for o in job["service_options"])
    assert job["size_bytes"] < MAX_JOB_BYTES


@pytest.mark.parametrize("command", ["filter", "evaluate"])
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_filter_and_evaluate_are_batch_jobs_on_the_recipes_accelerators(recipe, command, capsys, offline):
    job = _dry_run(capsys, [command, "--config", f"configs/{recipe}", *INPUTS[command]])
    assert job["dry_run"] == command and job["job_type"] == "JOB_TYPE_BATCH"
    _check_accelerator_job(job, recipe)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_rollout_is_a_streaming_engine_job_whose_size_does_not_grow_with_the_training_set(
        recipe, train_sets, capsys, offline):
    jobs = {count: _dry_run(capsys, ["rollout", "--config", f"configs/{recipe}", "--train-set", str(path)])
            for count, path in train_sets.items()}
    for job in jobs.values():
        assert job["dry_run"] == "rollout" and job["job_type"] == "JOB_TYPE_STREAMING" and job["streaming_engine"]
        _check_accelerator_job(job, recipe)
    assert abs(jobs[100_000]["size_bytes"] - jobs[100]["size_bytes"]) < 10_000


def test_the_command_line_wins_over_the_recipe_in_the_translated_job(train_sets, capsys, offline):
    job = _dry_run(capsys, ["rollout", "--config", "configs/qwen25_7b_math_dataflow_tpu.yaml", "--train-set",
                            str(train_sets[100]), "--max_num_workers", "3",
                            "--dataflow_service_options=worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1",
                            "--machine_type=ct5lp-hightpu-1t"])
    assert job["max_num_workers"] == 3 and job["machine_type"] == "ct5lp-hightpu-1t"
    assert job["accelerator"] == "type:tpu-v5-lite-podslice;topology:1x1"
