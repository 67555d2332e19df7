"""Host-side work on pathological completions: every parse of model text outside a sandbox, per sample.

The scorer's own process reads model text before any sandbox or pool is involved: the code verifier
finds the program (``extract_code``, ``build_program``), math finds the final answer
(``extract_answer``, ``plain_number``), the format terms and the story task scan it. A degenerate
policy writes newline runs, long repeats and nested braces; on a backtracking pattern these cost
seconds per sample (64,000 newlines took 15.7 s in ``build_program`` before issue 30). For each
input this measures, in the same run:

  seconds            CPU seconds of all host-side scorers on the sample (best of ``--repeats``)
  budget_seconds     the fixed budget per sample (``BUDGET_S``); within_budget says whether it held
  seconds_2x         the same on the input twice as long; growth = seconds_2x / seconds (about 2: linear)
  scan_seconds       the baseline: one linear regular-expression pass over the same text
  vs_scan            seconds / scan_seconds

Prints one JSON object; ``tests/rewards/test_host_parsing.py`` runs the same scorers on the same
inputs with a generous bound.

    python benchmarks/host_parsing.py [--chars 64000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from rlax_core.rewards import RewardConfig  # noqa: E402
from rlax_core.rewards.answers import extract_answer  # noqa: E402
from rlax_core.rewards.code_verifier import CodeTests, build_program  # noqa: E402
from rlax_core.rewards.math_verifier import plain_number  # noqa: E402
from rlax_core.rewards.registry import Sample  # noqa: E402
from rlax_core.rewards.terms import BoxedAnswer, FencedCode, ThinkThenAnswer  # noqa: E402
from rlax_core.tasks.story import score_story  # noqa: E402

from answers import MEASURABLE_S, best_cpu_seconds  # noqa: E402 - the same clock as the extraction benchmark

BUDGET_S = 0.05  # per sample, all host-side scorers together
_SCAN = re.compile(r"[\n{}\\#`\d]")
_HUMANEVAL = CodeTests(cases=("check(f)",), prompt="from typing import List\n\ndef f(xs: List[int]) -> int:\n",
                       entry_point="f")


def pathological(chars: int) -> dict[str, str]:
    """Degenerate completions of about ``chars`` characters each."""
    def fill(unit: str) -> str:
        return unit * max(1, chars // len(unit))

    return {
        "newlines": fill("\n"),
        "blank_lines": fill(" " * 63 + "\n"),
        "fence_then_blanks": "```" + fill(" "),
        "fence_python_then_tabs": "```python" + fill("\t"),
        "open_fences": fill("```\n"),
        "repeated_def": fill("def f(\n"),
        "nested_braces": "\\boxed{" + "{" * (chars // 2) + "}" * (chars // 2),
        "open_boxes": fill("\\boxed{"),
        "repeated_answer_is": fill("the answer is 1. "),
        "digit_run": fill("9"),
        "digits_and_commas": fill("1,"),
        "repeated_phrase": fill("Once upon a time there was a dog. "),
        "think_tags": fill("<think>"),
    }


def host_scorers() -> dict[str, Callable[[str], object]]:
    """Every parse of model text that runs in the scorer's process, by name."""
    config = RewardConfig(terms={"format_boxed": 1.0})
    terms = [BoxedAnswer(config), ThinkThenAnswer(config), FencedCode(config)]
    return {
        "build_program": lambda text: build_program(text, _HUMANEVAL),
        "extract_answer": extract_answer,
        "plain_number": plain_number,
        "format_terms": lambda text: [term.score(Sample({}, text)) for term in terms],
        "story": lambda text: score_story(text, "length"),
    }


def measure(name: str, text: str, doubled: str, repeats: int) -> dict:
    scorers = list(host_scorers().values())

    def score_all(sample: str) -> None:
        for scorer in scorers:
            scorer(sample)

    one = best_cpu_seconds(lambda: score_all(text), repeats)
    two = best_cpu_seconds(lambda: score_all(doubled), repeats)
    scan = best_cpu_seconds(lambda: sum(1 for _ in _SCAN.finditer(text)), repeats)
    return {"input": name, "chars": len(text), "seconds": round(one, 4), "budget_seconds": BUDGET_S,
            "within_budget": one <= BUDGET_S, "seconds_2x": round(two, 4),
            "growth": round(two / one, 2) if one >= MEASURABLE_S else None,
            "scan_seconds": round(scan, 4), "vs_scan": round(one / scan, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chars", type=int, default=64_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    inputs, doubled = pathological(args.chars), pathological(2 * args.chars)
    rows = [measure(name, text, doubled[name], args.repeats) for name, text in inputs.items()]
    print(json.dumps({"benchmark": "host_parsing", "chars": args.chars, "repeats": args.repeats,
                      "budget_seconds_per_sample": BUDGET_S, "all_within_budget": all(r["within_budget"] for r in rows),
                      "max_seconds": max(r["seconds"] for r in rows),
                      "max_growth": max((r["growth"] for r in rows if r["growth"] is not None), default=None),
                      "results": rows}, indent=1))


if __name__ == "__main__":
    main()
