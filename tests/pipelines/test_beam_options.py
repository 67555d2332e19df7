"""One rule for Beam options in every command: the config's ``beam:`` section, then the command line, key by key."""

import pytest
from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions, WorkerOptions

from pipelines.config import BEAM_COMMANDS, BeamSpec, load_run_config
from pipelines.runners import merge_beam_args, pipeline_options
from rlax_core.config import ConfigError


def test_the_command_line_wins_key_by_key_and_the_config_keeps_its_other_keys():
    config = ["--runner=DataflowRunner", "--project=p", "--region", "us-central1", "--max_num_workers=16",
              "--dataflow_service_options=a", "--dataflow_service_options=b", "--enable_streaming_engine"]
    merged = merge_beam_args(config, ["--region=europe-west4", "--max-num-workers", "2", "--dataflow_service_options=c"])
    assert merged == ["--runner=DataflowRunner", "--project=p", "--enable_streaming_engine",
                      "--region=europe-west4", "--max-num-workers", "2", "--dataflow_service_options=c"]


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
