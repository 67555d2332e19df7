"""Filter, rollouts and evaluation give the model the same text for the same example (the task's format)."""

from pathlib import Path

import pytest

from rlax_core.data.records import make_example
from rlax_core.models.tokenizer import load_tokenizer
from rlax_core.tasks.prompts import BOXED_INSTRUCTION, render_prompt
from rlax_core.rollout.host import EngineHost

REPO = Path(__file__).resolve().parents[2]
STORIES = REPO / "pipelines" / "assets" / "stories260K"


def _qwen2_tokenizer_dir(data_dir) -> Path:
    return data_dir / "tokenizers" / "qwen2"


EXAMPLES = [
    make_example(source="gsm8k", prompt="What is 6 times 7?", task="math", answer="42"),
    make_example(source="mbpp", prompt="Write a function to add two numbers.", task="code", answer="",
                 tests={"test_list": ["assert add(1, 2) == 3"], "test_setup_code": ""}),
]


def _host(tokenizer) -> EngineHost:
    """The engine host of filter, evaluate and rollouts alike (RunInference's model and the rollout
    worker's) with its tokenizer only: the prompt method reads nothing else, and loading a model would
    not change the text it builds."""
    host = EngineHost.__new__(EngineHost)
    host.tokenizer, host._prompt_ids = tokenizer, {}
    return host


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e["task"])
def test_filter_rollout_and_evaluate_read_the_same_prompt(example, data_dir):
    tokenizer = load_tokenizer(_qwen2_tokenizer_dir(data_dir))
    ids = list(_host(tokenizer).prompt_ids(example))
    text, add_bos = render_prompt(example, tokenizer)
    assert tokenizer.decode(ids) == text and not add_bos
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")  # a chat turn
    if example["task"] == "math":
        assert "What is 6 times 7?" + BOXED_INSTRUCTION in text
    else:
        assert "assert add(1, 2) == 3" in text and "```python" in text


def test_a_story_prompt_is_the_text_after_bos_for_every_reader():
    from rlax_core.tasks.story import story_examples

    tokenizer = load_tokenizer(STORIES)
    example = story_examples("train", 1)[0]
    assert list(_host(tokenizer).prompt_ids(example)) == tokenizer.encode(example["prompt"], add_bos=True)


def test_an_example_of_an_unknown_task_is_refused_by_name():
    with pytest.raises(ValueError, match="no prompt format for task 'poetry'"):
        render_prompt({"task": "poetry", "prompt": "x"}, load_tokenizer(STORIES))
