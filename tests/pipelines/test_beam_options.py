"""One rule for Beam options in every command: the config's ``beam:`` section, then the command line, key by key."""

from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions, WorkerOptions

from pipelines.config import BEAM_COMMANDS, BeamSpec, load_run_config
from pipelines.beam_args import merge_beam_args, set_entries
from pipelines.cli import build_parser, overrides_of
from pipelines.runners import WORKER_PYTHON, pipeline_options, require_worker_python
from rlax_core.config import ConfigError


def test_the_command_line_wins_key_by_key_and_the_config_keeps_its_other_keys():
    config = ["--runner=DataflowRunner", "--project=p", "--region", "us-central1", "--max_num_workers=16",
              "--enable_streaming_engine"]
    merged = merge_beam_args(config, ["--region=europe-west4", "--max-num-workers", "2"])
    assert merged == ["--runner=DataflowRunner", "--project=p", "--enable_streaming_engine",
                      "--region=europe-west4", "--max-num-workers", "2"]


RECIPE_7B = ["--dataflow_service_options=worker_accelerator=type:tpu-v5-lite-podslice;topology:2x2",
             "--experiments=use_runner_v2", "--experiments=no_use_multiple_sdk_containers", "--machine_type=ct5lp-hightpu-4t"]


@pytest.mark.parametrize("added", [["--dataflow_service_options=automatically_use_created_reservation"],
                                   ["--dataflow_service_options", "automatically_use_created_reservation"],
                                   ["--experiments=enable_data_sampling"], ["--experiments", "enable_data_sampling"]])
def test_a_service_option_or_experiment_on_the_command_line_adds_to_the_recipes(added):
    merged = merge_beam_args(RECIPE_7B, added)
    assert set_entries(merged, "dataflow_service_options")[0] == "worker_accelerator=type:tpu-v5-lite-podslice;topology:2x2"
    assert {"use_runner_v2", "no_use_multiple_sdk_containers"} <= set(set_entries(merged, "experiments"))
    assert added[-1].rsplit("=", 1)[-1] in set_entries(merged, added[0][2:].split("=")[0])


def test_an_entry_of_the_same_key_replaces_the_recipes_and_a_repeated_one_is_kept_once():
    merged = merge_beam_args(RECIPE_7B, ["--dataflow_service_options=worker_accelerator=type:tpu-v5-lite-podslice;"
                                         "topology:1x1", "--experiments=use_multiple_sdk_containers",
                                         "--experiments=use_runner_v2"])
    assert set_entries(merged, "dataflow_service_options") == ["worker_accelerator=type:tpu-v5-lite-podslice;topology:1x1"]
    assert sorted(set_entries(merged, "experiments")) == ["use_multiple_sdk_containers", "use_runner_v2"]


def test_an_entry_is_removed_only_by_an_explicit_drop_and_never_the_accelerator():
    merged = merge_beam_args(RECIPE_7B, ["--drop_experiments=no_use_multiple_sdk_containers"])
    assert set_entries(merged, "experiments") == ["use_runner_v2"] and not any("drop" in a for a in merged)
    with pytest.raises(ConfigError, match="drop_dataflow_service_options.*worker_accelerator=type:tpu-v5-lite"):
        merge_beam_args(RECIPE_7B, ["--drop_dataflow_service_options=worker_accelerator"])


def test_a_command_section_adds_to_the_shared_experiments():
    beam = BeamSpec(options={"experiments": "use_runner_v2"},
                    filter={"experiments": ("use_runner_v2", "no_use_multiple_sdk_containers")})
    assert beam.args("filter") == ["--experiments=use_runner_v2", "--experiments=no_use_multiple_sdk_containers"]
    assert BeamSpec(options={"experiments": "a"}, curate={"experiments": "b"}).args("curate") == [
        "--experiments=a", "--experiments=b"]


def test_a_boolean_flag_is_one_key_and_does_not_swallow_the_next_flag():
    assert merge_beam_args(["--streaming", "--project=p"], ["--project", "q"]) == ["--streaming", "--project", "q"]


@pytest.mark.parametrize("command", BEAM_COMMANDS)
def test_every_command_merges_the_config_under_the_command_line(command):
    beam = BeamSpec(runner="DataflowRunner", options={"project": "p", "region": "us-east5", "temp_location": "gs://b/t"},
                    **{command: {"machine_type": "n2-standard-8"}})
    options = pipeline_options(beam.args(command), ["--region=us-central1"], streaming=command == "rollout")
    assert options.view_as(StandardOptions).runner == "DataflowRunner"
    assert options.view_as(GoogleCloudOptions).region == "us-central1"
    assert options.view_as(GoogleCloudOptions).project == "p"
    assert options.view_as(WorkerOptions).machine_type == "n2-standard-8"


def test_a_command_section_wins_over_the_shared_options_and_false_drops_a_flag():
    beam = BeamSpec(options={"machine_type": "ct5lp-hightpu-4t", "enable_streaming_engine": True},
                    curate={"machine_type": "n2-standard-8", "enable_streaming_engine": False})
    assert beam.args("curate") == ["--machine_type=n2-standard-8"]
    assert beam.args("rollout") == ["--machine_type=ct5lp-hightpu-4t", "--enable_streaming_engine"]


def test_a_list_repeats_its_flag():
    beam = load_run_config(None, ['beam.rollout={dataflow_service_options: ["worker_accelerator=type:x", "y"]}']).beam
    assert beam.args("rollout") == ["--dataflow_service_options=worker_accelerator=type:x",
                                    "--dataflow_service_options=y"]


def test_worker_accelerator_as_a_beam_option_is_refused_with_the_way_to_say_it():
    with pytest.raises(ConfigError, match="beam.rollout.worker_accelerator.*dataflow_service_options"):
        load_run_config(None, ["beam.rollout={worker_accelerator: 'type:tpu-v5-lite-podslice;topology:2x2'}"])


def test_no_runner_named_means_the_local_default_for_batch_and_for_streaming():
    assert pipeline_options(BeamSpec().args("curate")).view_as(StandardOptions).runner == "DirectRunner"
    assert pipeline_options(BeamSpec().args("rollout"), streaming=True).view_as(StandardOptions).runner == "PrismRunner"


def test_a_key_value_word_after_a_flag_that_takes_a_value_is_that_flags_value_not_an_override():
    parser = build_parser(only="rollout")
    argv = ["rollout", "--dataflow_service_options", "worker_accelerator=type:x", "--streaming", "loop.top_p=0.9",
            "--train-set", "a=b.parquet", "--max_num_workers", "4", "trainer.total_steps=5"]
    overrides = [word for word, override in zip(argv, overrides_of(argv, parser)) if override]
    assert overrides == ["loop.top_p=0.9", "trainer.total_steps=5"]


def test_a_dataflow_job_is_launched_only_from_the_worker_images_python():
    require_worker_python((3, 11))
    with pytest.raises(ConfigError, match="Dataflow workers run Python 3.11.*this launcher runs Python 3.12"):
        require_worker_python((3, 12))
    dockerfile = (Path(__file__).resolve().parents[2] / "docker" / "Dockerfile").read_text()
    assert f"FROM apache/beam_python{WORKER_PYTHON[0]}.{WORKER_PYTHON[1]}_sdk:" in dockerfile
