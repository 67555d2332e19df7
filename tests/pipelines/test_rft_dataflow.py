"""`rlax rft` translated for the DataflowRunner offline (``--dry_run``), as the filter is in test_dataflow_jobs.py.

The job graph carries code and settings only: the prompts are read by the workers from storage, so
the translated job for 100 prompts and for 100,000 is the same size, and both translate with no
socket leaving the machine.
"""

import json

import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from rlax_core.data.records import EXAMPLE_SCHEMA, make_example, to_table
from tests.pipelines.test_dataflow_jobs import MAX_JOB_BYTES, MODEL, RECIPES, check_accelerator_job, offline  # noqa: F401

RECIPE = "configs/rft_dataflow_gpu.yaml"
TPU_RECIPE = "qwen25_7b_math_dataflow_tpu.yaml"


@pytest.fixture(scope="module")
def prompt_sets(tmp_path_factory):
    """Prompt files of 100 and 100,000 rows, at paths of the same length."""
    paths = {}
    for count in (100, 100_000):
        rows = [make_example(source="synthetic", prompt=f"What is {i} plus {i + 1}?", task="math", answer=str(2 * i + 1))
                for i in range(count)]
        paths[count] = tmp_path_factory.mktemp(f"prompts_{count:06d}") / "prompts.parquet"
        pq.write_table(to_table(rows, EXAMPLE_SCHEMA), paths[count])
    return paths


def _dry_run(capsys, argv):
    assert main([*argv, "--dry_run=True"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith('{"')]
    return json.loads(lines[-1])


def test_the_rft_job_is_the_same_size_for_100_and_100000_prompts(prompt_sets, capsys, offline):
    jobs = {count: _dry_run(capsys, ["rft", "--config", RECIPE, "--input", str(path)])
            for count, path in prompt_sets.items()}
    for count, job in jobs.items():
        assert job["dry_run"] == "rft" and job["job_type"] == "JOB_TYPE_BATCH"
        assert job["inputs_not_checked"][0] == f"input {prompt_sets[count]}"
        assert job["accelerator"] == "type:nvidia-a100-80gb;count:1;install-nvidia-driver"
        assert "no_use_multiple_sdk_containers" in job["experiments"] and job["size_bytes"] < MAX_JOB_BYTES
    # A few bytes move between any two translations (pickled closures, the job's name holds the time);
    # the 100,000 prompts (megabytes of parquet) do not enter the job.
    assert abs(jobs[100]["pipeline_bytes"] - jobs[100_000]["pipeline_bytes"]) < 100
    assert abs(jobs[100]["size_bytes"] - jobs[100_000]["size_bytes"]) < 100
    assert prompt_sets[100_000].stat().st_size > 10 * jobs[100_000]["size_bytes"]  # the data would show


@pytest.mark.parametrize("recipe", [TPU_RECIPE])
def test_rft_runs_on_a_recipes_filter_workers(recipe, capsys, offline):
    # beam.rft left empty: the recipe's filter workers (the same engine, the same accelerator).
    job = _dry_run(capsys, ["rft", "--config", f"configs/{recipe}", "rft.input=gs://b/prompts/*.parquet",
                            "rft.output=gs://b/rft", f"rft.generator={MODEL}"])
    assert job["dry_run"] == "rft" and job["job_type"] == "JOB_TYPE_BATCH"
    check_accelerator_job(job, recipe)


def test_a_generator_that_does_not_fit_the_recipes_filter_workers_is_refused_before_translating(capsys, offline):
    # The 7B TPU recipe's filter workers are v5e chips of 16 GiB: a float32 7B teacher on one chip is refused.
    code = main(["rft", "--config", f"configs/{TPU_RECIPE}", "rft.input=gs://b/prompts/*.parquet", "rft.output=gs://b/rft",
                 "rft.generator=gs://my-rlax-bucket/models/Qwen2.5-7B", "--dry_run=True"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code == 2 and error.startswith("rlax rft: config error: hardware: rft: Qwen2.5-7B on 64 x v5e")
    assert "does not fit" in error and "tensor_parallel" in error
