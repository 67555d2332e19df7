"""A user's own rewards (``rewards.modules`` / ``rewards.functions``): from files outside the package, into
every place that scores, refused when a name is taken."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.config import ConfigError, from_dict
from rlax_core.rewards import RewardConfig, Rewarder
from rlax_core.rewards.registry import REWARDS

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = {"id": "ex1", "prompt": "Tom had a dog.", "answer": "", "task": "story"}


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def test_a_function_in_a_file_becomes_a_term(tmp_path):
    rewards = write(tmp_path / "my_rewards.py", """
        def short(completion, example):
            return (1.0 if len(completion.split()) <= 5 else 0.0, {"pass": len(completion.split()) <= 5})

        def mentions_dog(completion, example):
            return "dog" in completion
    """)
    config = from_dict(RewardConfig, {"functions": {"cf_short": f"{rewards}:short", "cf_dog": f"{rewards}:mentions_dog"},
                                      "terms": {"cf_short": 1.0, "cf_dog": 0.5}})
    with Rewarder(config) as rewarder:
        reward, info = rewarder(EXAMPLE, "The dog ran.")
        assert reward == 1.5 and info["pass"] and info["terms"]["cf_dog"] == {"score": 1.0, "pass": True}
        reward, info = rewarder(EXAMPLE, "The cat sat on the big mat all day.")
        assert reward == 0.0 and not info["pass"]
    RewardConfig(functions=dict(config.functions), terms={"cf_dog": 1.0})  # the same functions again: no clash


def test_a_module_file_registers_terms_once_per_process(tmp_path):
    module = write(tmp_path / "story_rules.py", """
        from rlax_core.rewards import RewardResult, RewardTerm, register_reward

        @register_reward("cm_exclaims")
        class Exclaims(RewardTerm):
            def score(self, sample):
                return RewardResult(float(sample.completion.count("!")), {})
    """)
    for _ in range(2):  # imported once: the second config registers nothing again
        config = RewardConfig(modules=(str(module),), terms={"cm_exclaims": 1.0})
    assert Rewarder(config)(EXAMPLE, "Wow! Yes!").score == 2.0
    relative = os.path.relpath(module)
    assert RewardConfig(modules=(relative,), terms={"cm_exclaims": 1.0})  # the same file by another path


def test_a_taken_name_is_refused(tmp_path):
    rewards = write(tmp_path / "clash.py", """
        from rlax_core.rewards import RewardResult, RewardTerm, register_reward

        def score(completion, example):
            return 1.0
    """)
    with pytest.raises(ConfigError, match=r"functions\.math: .*already registered"):
        RewardConfig(functions={"math": f"{rewards}:score"}, terms={"math": 1.0})
    module = write(tmp_path / "clash_module.py", """
        from rlax_core.rewards import RewardResult, RewardTerm, register_reward

        @register_reward("format_boxed")
        class MyBoxed(RewardTerm):
            pass
    """)
    with pytest.raises(ConfigError, match=r"modules\[0\]: .*'format_boxed' is already registered"):
        RewardConfig(modules=(str(module),), terms={"format_boxed": 1.0})
    assert REWARDS["math"].__module__ == "rlax_core.rewards.terms"


def test_bad_specs_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"modules\[0\]: reward file .*nowhere.py: No such file"):
        RewardConfig(modules=(str(tmp_path / "nowhere.py"),))
    with pytest.raises(ConfigError, match="reward module no_such_module_xyz: ModuleNotFoundError"):
        RewardConfig(modules=("no_such_module_xyz",))
    write(tmp_path / "empty.py", "x = 1\n")
    with pytest.raises(ConfigError, match=r"functions\.cb_f: .*has no function 'score'"):
        RewardConfig(functions={"cb_f": f"{tmp_path / 'empty.py'}:score"}, terms={"cb_f": 1.0})
    with pytest.raises(ConfigError, match="write MODULE:FUNCTION"):
        RewardConfig(functions={"cb_g": "just_a_name"}, terms={"cb_g": 1.0})


def test_the_example_of_docs_rewards_md_works_as_written(tmp_path, monkeypatch):
    import re

    import yaml

    page = (REPO / "docs" / "rewards.md").read_text()
    section = page.split("### Your own reward", 1)[1].split("\n### ", 1)[0]
    python = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    config = yaml.safe_load(re.search(r"```yaml\n(.*?)```", section, re.S).group(1))
    (tmp_path / "my_rewards.py").write_text(python)
    monkeypatch.chdir(tmp_path)  # the page names the file relative to where the command runs
    rewards = from_dict(RewardConfig, config["loop"]["rewards"])
    with Rewarder(rewards) as rewarder:
        one = rewarder({**EXAMPLE, "answer": "happy"}, "Tom was happy.")
        two = rewarder({**EXAMPLE, "answer": "happy"}, "Tom ran. He fell.")
    assert one.info["terms"]["one_sentence"] == {"score": 1.0, "pass": True, "sentences": 1}
    assert two.info["terms"]["one_sentence"]["score"] == 0.0


def test_evaluation_verdicts_can_come_from_a_users_term(tmp_path):
    from pipelines.sections import EvaluateConfig, FilterConfig
    from rlax_core.eval.verify import TASK_TERMS, Verifier

    rewards = write(tmp_path / "verdicts.py", """
        def ends_with_period(completion, example):
            return completion.rstrip().endswith(".")
    """)
    config = from_dict(EvaluateConfig, {"rewards": {"functions": {"cv_period": f"{rewards}:ends_with_period"}},
                                        "task_terms": {"story": "cv_period"}})
    verifier = Verifier({**TASK_TERMS, **config.task_terms}, rewards=config.rewards)
    verdicts = verifier.verify(EXAMPLE, ["The end.", "and then"], ["stop", "length"])
    assert [v.correct for v in verdicts] == [True, False]
    verifier.close()
    for section in (EvaluateConfig, FilterConfig):
        with pytest.raises(ConfigError, match="task_terms.story: a registered reward term"):
            from_dict(section, {"task_terms": {"story": "cv_nobody"}})
    assert from_dict(FilterConfig, {"rewards": {"functions": {"cv_period": f"{rewards}:ends_with_period"}},
                                    "task_terms": {"story": "cv_period"}}).task_terms == {"story": "cv_period"}


# ----------------------------------------------------------------------------- on Beam workers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def worker_pool(tmp_path):
    """Beam SDK workers in processes of their own (Beam's worker pool): a module the test process
    imported is not imported there, so only the DoFn's setup can bring the user's reward in."""
    port = _free_port()
    log = open(tmp_path / "worker_pool.log", "w")
    # The pool starts each worker as `python -c ...`: this interpreter's folder first on PATH.
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    process = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                                f"--service_port={port}"], env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert process.poll() is None, (tmp_path / "worker_pool.log").read_text()
            assert time.monotonic() < deadline, "Beam's worker pool did not start within 60 s"
            time.sleep(0.2)
    yield f"localhost:{port}"
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()


class _RecordWorker(beam.DoFn):
    """The rewards of each group, and whether this worker process is another than the test's."""

    def __init__(self, test_pid: int):
        self._test_pid = test_pid

    def process(self, group):
        yield (group["example"]["id"], [row["reward"] for row in group["rows"]],
               [json.loads(row["reward_info"])["terms"]["pr_vowels"]["vowels"] for row in group["rows"]],
               os.getpid() != self._test_pid)


@pytest.mark.slow  # about 30 s: Prism, a worker pool and its worker process start
def test_a_reward_in_a_file_outside_the_package_scores_rollouts_on_prism_workers(tmp_path, worker_pool):
    from pipelines.runners import pipeline_options
    from tests.support.rollout_spec import rollout_spec
    from transforms.rollout import ScoreRollouts

    (tmp_path / "outside").mkdir()
    rewards = write(tmp_path / "outside" / "vowel_reward.py", """
        def vowels(completion, example):
            count = sum(completion.count(v) for v in "aeiou")
            return count / 10, {"vowels": count}
    """)
    config = RewardConfig(functions={"pr_vowels": f"{rewards}:vowels"}, terms={"pr_vowels": 1.0})
    spec = rollout_spec(tmp_path, run="r", samples_per_prompt=2, rewards=config)
    groups = [{"example": {**EXAMPLE, "id": f"ex{i}"}, "texts": texts,
               "rows": [{"completion_ids": [1, 2], "finish_reason": "stop"} for _ in texts]}
              for i, texts in enumerate([["aaa", "bcd"], ["queue", ""]])]
    options = pipeline_options(["--runner=PrismRunner", "--environment_type=EXTERNAL",
                                f"--environment_config={worker_pool}"])
    with beam.Pipeline(options=options) as pipeline:
        scored = (pipeline | beam.Create(groups) | beam.ParDo(ScoreRollouts(spec))
                  | beam.ParDo(_RecordWorker(os.getpid())))
        assert_that(scored, equal_to([("ex0", [0.3, 0.0], [3, 0], True), ("ex1", [0.4, 0.0], [4, 0], True)]))
