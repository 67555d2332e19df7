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
from pipelines.config import load_run_config
from pipelines.dataflow_job import translate
from pipelines.rl_stream import build, build_spec, load_configs
from pipelines.runners import pipeline_options
from rlax_core.data.records import EXAMPLE_SCHEMA, make_example, to_table

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "fixtures" / "data"
MODEL = REPO / "pipelines" / "assets" / "stories260K"
RECIPES = {  # recipe -> (accelerator service option, accelerator machine type, worker image)
    "qwen25_7b_math_dataflow_tpu.yaml": ("type:tpu-v5-lite-podslice;topology:2x2", "ct5lp-hightpu-4t", "rlax-worker-tpu"),
    "qwq32b_code_tpu_1024.yaml": ("type:tpu-v6e-slice;topology:2x4", "ct6e-standard-8t", "rlax-worker-tpu"),
    "qwen25_coder_7b_sql_dataflow_tpu.yaml": ("type:tpu-v5-lite-podslice;topology:2x2", "ct5lp-hightpu-4t",
                                              "rlax-worker-tpu"),
    "qwq32b_code_lora_tpu.yaml": ("type:tpu-v6e-slice;topology:2x4", "ct6e-standard-8t", "rlax-worker-tpu"),
    "qwen25_1p5b_math_dataflow_gpu.yaml": ("type:nvidia-l4;count:1;install-nvidia-driver", "g2-standard-8",
                                           "rlax-worker-gpu"),
    "qwen25_1p5b_math_tool_dataflow_gpu.yaml": ("type:nvidia-l4;count:1;install-nvidia-driver", "g2-standard-8",
                                                "rlax-worker-gpu"),
    "qwen25_7b_math_dataflow_gpu.yaml": ("type:nvidia-a100-80gb;count:1;install-nvidia-driver", "a2-ultragpu-1g",
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


def check_accelerator_job(job, recipe):
    accelerator, machine, image = RECIPES[recipe]
    assert job["runner"] == "DataflowRunner"
    assert job["accelerator"] == accelerator and job["machine_type"] == machine
    assert len(job["container_images"]) == 1 and f"/{image}:" in job["container_images"][0]
    assert "use_runner_v2" in job["experiments"] and "no_use_multiple_sdk_containers" in job["experiments"]
    assert "use_multiple_sdk_containers" not in job["experiments"]  # Beam adds it unless told not to
    assert job["size_bytes"] < MAX_JOB_BYTES


@pytest.mark.parametrize("recipe", [*sorted(RECIPES), "curate_dataflow.yaml"])
def test_curate_is_a_cpu_batch_job_on_the_cpu_image(recipe, capsys, offline):
    job = _dry_run(capsys, ["curate", "--config", f"configs/{recipe}", *INPUTS["curate"]])
    assert job["dry_run"] == "curate" and job["runner"] == "DataflowRunner" and job["job_type"] == "JOB_TYPE_BATCH"
    assert job["machine_type"].startswith(CPU_MACHINES) and job["accelerator"] is None
    assert not any(o.startswith("worker_accelerator") for o in job["service_options"])
    assert len(job["container_images"]) == 1 and "/rlax-worker-cpu:" in job["container_images"][0]
    assert job["size_bytes"] < MAX_JOB_BYTES


def test_a_dry_run_reads_no_input_and_says_which_it_did_not_check(capsys, offline):
    job = _dry_run(capsys, ["filter", "--config", "configs/filter_dataflow_gpu.yaml"])
    assert job["inputs_not_checked"] == ["input gs://my-rlax-bucket/curated/gsm8k-math/examples-*.parquet",
                                         "model gs://my-rlax-bucket/models/Qwen2.5-1.5B-Instruct"]
    job = _dry_run(capsys, ["rollout", "--config", "configs/qwen25_7b_math_dataflow_tpu.yaml"])
    assert job["inputs_not_checked"] == ["train set gs://my-rlax-bucket/filtered/gsm8k-math-qwen25-7b"]


def test_the_filter_recipe_runs_one_sdk_process_per_gpu_vm_on_the_gpu_image(capsys, offline):
    job = _dry_run(capsys, ["filter", "--config", "configs/filter_dataflow_gpu.yaml"])
    assert job["accelerator"] == "type:nvidia-l4;count:1;install-nvidia-driver" and job["machine_type"] == "g2-standard-8"
    assert "no_use_multiple_sdk_containers" in job["experiments"] and "use_multiple_sdk_containers" not in job["experiments"]
    assert len(job["container_images"]) == 1 and "/rlax-worker-gpu:" in job["container_images"][0]


@pytest.mark.parametrize("quoting", [["--dataflow_service_options", "worker_accelerator=type:tpu-v5-lite-podslice;topology:2x2"],
                                     ["--dataflow_service_options=worker_accelerator=type:tpu-v5-lite-podslice;topology:2x2"]])
def test_a_flag_value_is_a_beam_option_however_it_is_quoted(quoting, capsys, offline):
    # The filter recipe's header: its TPU variant replaces the recipe's L4 with a v5e slice.
    job = _dry_run(capsys, ["filter", "--config", "configs/filter_dataflow_gpu.yaml", "--machine_type",
                            "ct5lp-hightpu-4t", *quoting, "limit=5"])
    assert job["accelerator"] == "type:tpu-v5-lite-podslice;topology:2x2" and job["machine_type"] == "ct5lp-hightpu-4t"
    assert "no_use_multiple_sdk_containers" in job["experiments"]


@pytest.mark.parametrize("added", [["--dataflow_service_options=automatically_use_created_reservation"],
                                   ["--experiments", "enable_data_sampling"]])
def test_an_option_added_on_the_command_line_keeps_the_recipes_accelerator_and_one_sdk_process(added, capsys, offline):
    job = _dry_run(capsys, ["rollout", "--config", "configs/qwen25_7b_math_dataflow_tpu.yaml", *added])
    check_accelerator_job(job, "qwen25_7b_math_dataflow_tpu.yaml")
    assert "use_multiple_sdk_containers" not in job["experiments"]
    assert added[-1].split("=", 1)[-1] in job["service_options"] + job["experiments"]


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_rollout_workers_harness_threads_fill_the_engines_slots(recipe):
    config = load_run_config(f"configs/{recipe}")
    threads = int(next(a.split("=", 1)[1] for a in config.beam.args("rollout")
                       if a.startswith("--number_of_worker_harness_threads=")))
    assert threads * config.loop.groups_per_unit * config.loop.sampling.samples_per_prompt == config.engine.num_slots


@pytest.mark.parametrize("command", ["filter", "evaluate"])
@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_filter_and_evaluate_are_batch_jobs_on_the_recipes_accelerators(recipe, command, capsys, offline):
    job = _dry_run(capsys, [command, "--config", f"configs/{recipe}", *INPUTS[command]])
    assert job["dry_run"] == command and job["job_type"] == "JOB_TYPE_BATCH"
    check_accelerator_job(job, recipe)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_rollout_is_a_streaming_engine_job_whose_size_does_not_grow_with_the_training_set(recipe, train_sets, offline):
    # As a real launch translates it: the training set read and counted, its path and count in the job.
    from rlax_core.data.training_set import read_examples

    jobs = {}
    for count, path in train_sets.items():
        run_config, loop = load_configs(f"configs/{recipe}", [f"loop.train_set={path}"])
        spec = build_spec(run_config, len(read_examples(str(path))))
        options = pipeline_options(run_config.beam.args("rollout"), ["--dry_run=True"], streaming=True)
        jobs[count] = translate(options, lambda pipeline: build(pipeline, spec, loop)).summary()
    for job in jobs.values():
        assert job["job_type"] == "JOB_TYPE_STREAMING" and job["streaming_engine"]
        check_accelerator_job(job, recipe)
    assert abs(jobs[100_000]["size_bytes"] - jobs[100]["size_bytes"]) < 10_000


def test_the_command_line_wins_over_the_recipe_in_the_translated_job(train_sets, capsys, offline):
    job = _dry_run(capsys, ["rollout", "--config", "configs/qwen25_7b_math_dataflow_tpu.yaml", "--train-set",
                            str(train_sets[100]), "--max_num_workers", "3",
                            "--dataflow_service_options=worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1",
                            "--machine_type=ct5lp-hightpu-1t"])
    assert job["max_num_workers"] == 3 and job["machine_type"] == "ct5lp-hightpu-1t"
    assert job["accelerator"] == "type:tpu-v5-lite-podslice;topology:1x1"


def test_the_sql_recipes_curation_ships_no_database_in_its_job(capsys, offline):
    # Spider's layout with the databases in storage: the translated job names the folder, never its bytes.
    sql_tiny = REPO / "pipelines" / "assets" / "sql_tiny"
    job = _dry_run(capsys, ["curate", "--config", "configs/qwen25_coder_7b_sql_dataflow_tpu.yaml",
                            f"curate.inputs=[{{path: {sql_tiny}/train.json, format: spider, databases: {sql_tiny}}}]",
                            f"curate.decontaminate_against=[{{path: {sql_tiny}/heldout.json, format: spider}}]"])
    assert job["dry_run"] == "curate" and job["runner"] == "DataflowRunner" and job["job_type"] == "JOB_TYPE_BATCH"
    assert job["machine_type"].startswith(CPU_MACHINES) and "/rlax-worker-cpu:" in job["container_images"][0]
    assert job["size_bytes"] < MAX_JOB_BYTES


def test_a_curriculum_s_rollout_job_translates_and_does_not_grow_with_the_prompts(train_sets, offline):
    # The curriculum's state lives beside the rollout store and is read by workers, never in the graph.
    from rlax_core.data.training_set import read_examples

    recipe = "qwen25_7b_math_dataflow_tpu.yaml"
    jobs = {}
    for count, path in train_sets.items():
        run_config, loop = load_configs(f"configs/{recipe}", [f"loop.train_set={path}", "loop.curriculum.kind=balanced",
                                                              "loop.curriculum.retire_after_solved=3"])
        spec = build_spec(run_config, len(read_examples(str(path))))
        options = pipeline_options(run_config.beam.args("rollout"), ["--dry_run=True"], streaming=True)
        jobs[count] = translate(options, lambda pipeline: build(pipeline, spec, loop)).summary()
    for job in jobs.values():
        assert job["job_type"] == "JOB_TYPE_STREAMING" and job["streaming_engine"]
        check_accelerator_job(job, recipe)
    assert abs(jobs[100_000]["size_bytes"] - jobs[100]["size_bytes"]) < 10_000
