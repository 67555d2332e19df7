"""SampleAndVerify: RunInference with the engine ModelHandler on stories260K, verdicts from the story reward."""

import dataclasses

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from rlax_core.inference.config import EngineConfig, SamplingConfig
from rlax_core.tasks.story import score_story, story_examples
from transforms.inference import GenerationSpec, SampleAndVerify

SPEC = GenerationSpec(model="pipelines/assets/stories260K",
                      sampling=SamplingConfig(samples_per_prompt=3, max_new_tokens=24, stop_strings=("\n",)),
                      batch_size=2, seed=5,
                      engine=EngineConfig(num_slots=4, max_prompt_len=64, max_new_tokens=24, prefill_buckets=(32, 64),
                                          num_pages=32))


def _check(result):
    """Shape of a result, and whether its verdicts agree with the story reward applied directly."""
    agree = all(score_story(text, finish)[1]["pass"] == ok
                for text, finish, ok in zip(result["texts"], result["finish_reasons"], result["correct"]))
    return (result["example"]["id"], len(result["texts"]), len(result["lengths"]), all(0 < n <= 24 for n in result["lengths"]),
            agree, result["model"], result["skipped"])


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])  # 2: an engine per device (the tests' simulated CPU devices)
def test_samples_are_generated_batched_and_verified(pipeline, replicas):
    examples = story_examples("heldout", 3)
    long_prompt = {**examples[0], "id": "too-long", "prompt": "Once upon a time " * 40}
    spec = dataclasses.replace(SPEC, engine=dataclasses.replace(SPEC.engine, replicas=replicas))
    with pipeline as p:
        results = p | beam.Create([*examples, long_prompt]) | SampleAndVerify(spec)
        expected = [(e["id"], 3, 3, True, True, "stories260K", None) for e in examples]
        assert_that(results | "Check" >> beam.Map(lambda r: _check(r) if r["example"]["id"] != "too-long"
                                                   else (r["example"]["id"], len(r["texts"]), r["skipped"] is not None)),
                    equal_to([*expected, ("too-long", 0, True)]))


def test_the_handler_batches_whole_batches_from_the_first():
    """Beam's default grows batches from one example; each engine call of a few prompts pays a whole
    decode's latency, so the handler asks for ``batch_size`` prompts from the first batch."""
    from transforms.inference import EngineModelHandler

    kwargs = EngineModelHandler(SPEC).batch_elements_kwargs()
    assert (kwargs["min_batch_size"], kwargs["max_batch_size"]) == (SPEC.batch_size, SPEC.batch_size)
