"""A user's curriculum module (``loop.curriculum.modules``) is imported on a Beam worker process, as a
user's reward modules are: the config reaches the worker pickled, as names, and the DoFn's setup
imports the module there before the curriculum is built (``rlax_core.rollout.curriculum``)."""

import json
import os
import textwrap

import apache_beam as beam
import pytest

from rlax_core.rollout.curriculum import CurriculumConfig
from rlax_core.rollout.metrics import group_summary
from rlax_core.tasks.story import story_examples, write_jsonl
from tests.rewards.test_custom_rewards import worker_pool  # noqa: F401  (the fixture: Beam's worker pool)
from tests.support.rollout_spec import rollout_spec

GROUPS = 2


def _summary(slot: int) -> tuple[int, dict]:
    rows = [{"reward": 1.0, "reward_info": json.dumps({"pass": True}), "completion_ids": [1, 2], "policy_version": 0}]
    return 0, group_summary({"key": (0, slot), "rows": rows, "generate_seconds": 0.1, "worker": "w"}, written=True)


@pytest.mark.slow  # about 30 s: Prism, a worker pool and its worker process start
def test_a_user_curriculum_module_is_imported_on_a_worker_process(tmp_path, worker_pool):  # noqa: F811
    from pipelines.runners import pipeline_options
    from transforms.rollout import MarkStepGenerated

    imported = tmp_path / "imported_by.txt"
    module = tmp_path / "outside" / "last_rows_curriculum.py"
    module.parent.mkdir()
    module.write_text(textwrap.dedent(f"""
        import os
        from rlax_core.rollout.curriculum import register_curriculum

        with open({str(imported)!r}, "a") as log:  # which processes imported this file
            log.write(f"{{os.getpid()}}\\n")

        @register_curriculum("test_last_rows")
        def last_rows(prompts, step, seed, count):
            return [len(prompts.ids) - 1 - i for i in range(count)]
    """))
    train_set = tmp_path / "train.jsonl"
    write_jsonl(story_examples("train", 6), train_set)
    spec = rollout_spec(tmp_path, run="w", train_set=str(train_set), train_set_size=6, groups_per_step=GROUPS,
                        curriculum=CurriculumConfig(kind="test_last_rows", modules=(str(module),)))
    options = pipeline_options(["--runner=PrismRunner", "--environment_type=EXTERNAL",
                                f"--environment_config={worker_pool}"])
    with beam.Pipeline(options=options) as pipeline:
        _ = (pipeline | beam.Create([_summary(slot) for slot in range(GROUPS)]) | beam.GroupByKey()
             | beam.ParDo(MarkStepGenerated(spec)))
    pids = {int(line) for line in imported.read_text().split()}
    assert os.getpid() in pids and len(pids) >= 2  # this test's process (the config) and a worker's
    [metrics] = spec.store().read_step_metrics()
    assert metrics["curriculum/pool/eligible"] == 6 and metrics["curriculum/dropped_group_share"] == 0.0
