"""What a command would submit to Dataflow, translated here without submitting it.

Every Beam command takes Beam's ``--dry_run=True``: with ``--runner DataflowRunner`` the pipeline is
translated into the Dataflow job it would be (the portable pipeline, the worker pool, the service
options) and nothing is staged, sent or run. The command then prints that job's summary as one JSON
line and exits 0::

    rlax rollout --config configs/qwen25_7b_math_dataflow_tpu.yaml --dry_run=True

Translation needs no credentials and no network: Beam returns before it creates its Dataflow client
(which is what stages ``--setup_file`` and the pipeline); this module then builds the job's
``Environment`` (worker pool, container images, service options) from the same options with Beam's
own ``apiclient.Environment``, as ``DataflowApplicationClient.create_job_description`` would. The
commands translate against their recipe's paths without reading them (a dry run is offline): the
summary's ``inputs_not_checked`` lists what a real run would check first.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TestOptions


@dataclasses.dataclass(frozen=True)
class DataflowJob:
    """The parts of a translated Dataflow job a recipe is checked by."""

    runner: str
    job_type: str  # JOB_TYPE_BATCH or JOB_TYPE_STREAMING
    experiments: tuple[str, ...]
    service_options: tuple[str, ...]  # e.g. worker_accelerator=type:tpu-v5-lite-podslice;topology:2x2
    machine_type: str
    max_num_workers: int
    container_images: tuple[str, ...]  # one per SDK environment of the pipeline
    pipeline_bytes: int  # the serialized portable pipeline Dataflow receives
    job_bytes: int  # the job request: its JSON with the environment, the pipeline's steps included

    @property
    def streaming_engine(self) -> bool:
        return "enable_streaming_engine" in self.experiments

    @property
    def accelerator(self) -> str | None:
        found = [o.split("=", 1)[1] for o in self.service_options if o.startswith("worker_accelerator=")]
        return found[0] if found else None

    @property
    def size_bytes(self) -> int:
        return self.pipeline_bytes + self.job_bytes

    def summary(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "streaming_engine": self.streaming_engine, "accelerator": self.accelerator,
                "size_bytes": self.size_bytes}


def is_dry_run(options: PipelineOptions) -> bool:
    return bool(options.view_as(TestOptions).dry_run)


def translate(options: PipelineOptions, build: Callable[[beam.Pipeline], Any]) -> DataflowJob:
    """``build`` a pipeline under ``options`` (a DataflowRunner with ``--dry_run=True``) and translate it."""
    from apache_beam.runners.dataflow.internal import apiclient

    runner = options.view_as(StandardOptions).runner
    if runner not in ("DataflowRunner", "dataflow") or not is_dry_run(options):
        raise ValueError(f"translate() needs --runner DataflowRunner and --dry_run=True, got runner {runner!r}")
    pipeline = beam.Pipeline(options=options)
    build(pipeline)
    job = pipeline.run().job  # with dry_run the runner returns before it stages or submits anything
    staged_pipeline_url = f"{job.google_cloud_options.staging_location.rstrip('/')}/pipeline.pb"
    environment = apiclient.Environment(packages=[], options=job.options,
                                        environment_version=apiclient._FNAPI_ENVIRONMENT_MAJOR_VERSION,
                                        proto_pipeline_staged_url=staged_pipeline_url,
                                        proto_pipeline=job.proto_pipeline).proto
    job.proto.environment = environment
    pool = environment.worker_pools[0]
    images = tuple(image.container_image for image in pool.sdk_harness_container_images) or (
        pool.worker_harness_container_image,)
    return DataflowJob(
        runner=runner,
        job_type=job.proto.type_.name,
        experiments=tuple(environment.experiments),
        service_options=tuple(environment.service_options),
        machine_type=pool.machine_type,
        max_num_workers=pool.autoscaling_settings.max_num_workers,
        container_images=images,
        pipeline_bytes=len(job.proto_pipeline.SerializeToString()),
        job_bytes=len(job.json().encode("utf-8")),  # the request's JSON in full (str(job) shortens long strings)
    )


def print_dry_run(command: str, options: PipelineOptions, build: Callable[[beam.Pipeline], Any],
                  inputs_not_checked: Sequence[str] = ()) -> int:
    """Translate, print ``{"dry_run": command, ...summary, "inputs_not_checked": [...]}`` as one JSON
    line; the command's exit code. ``inputs_not_checked``: the paths a real run checks before it starts."""
    job = translate(options, build)
    print(json.dumps({"dry_run": command, **job.summary(), "inputs_not_checked": list(inputs_not_checked)},
                     sort_keys=True))
    return 0
