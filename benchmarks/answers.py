"""Answer extraction on megabyte inputs: time grows linearly with the input, as a plain scan's does.

A backtracking regular expression over ``\\boxed{`` nests or long digit runs takes hours on these
inputs; the extractors in ``rlax_core.rewards.answers`` (and ``plain_number``, which other modules call
on raw text) scan once. For each hostile input it measures, in the same run:

  seconds_1x, seconds_2x   ``extract_answer`` on the input and on the input repeated twice
  growth                   seconds_2x / seconds_1x: about 2 when linear, about 4 when quadratic
                           (null when seconds_1x is under a millisecond: too fast to tell)
  scan_seconds_1x          the baseline: one linear regular-expression pass over the same text
  vs_scan                  seconds_1x / scan_seconds_1x

CPU time (``time.process_time``), best of ``--repeats``. Prints one JSON object.

    python benchmarks/answers.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlax_core.rewards.answers import extract_answer  # noqa: E402
from rlax_core.rewards.math_verifier import plain_number  # noqa: E402

# The same hostile inputs as tests/rewards/test_answers.py, which checks what each one yields.
INPUTS = {
    "digits": "1" * 1_000_000,
    "open_boxes": "\\boxed{" * 200_000,
    "box_in_braces": "{" * 500_000 + "\\boxed{" + "}" * 500_000,
    "answer_is_repeated": "the answer is " * 70_000,
    "hashes_then_commas": "#### " + "9," * 500_000,
}
_SCAN = re.compile(r"[\d{}\\#]")
MEASURABLE_S = 1e-3  # below this the process clock's resolution decides the growth; it is reported as null


def best_cpu_seconds(function, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        function()
        best = min(best, time.process_time() - start)
    return max(best, 1e-6)


def measure(name: str, text: str, function, repeats: int) -> dict:
    one = best_cpu_seconds(lambda: function(text), repeats)
    two = best_cpu_seconds(lambda: function(text + text), repeats)
    scan = best_cpu_seconds(lambda: sum(1 for _ in _SCAN.finditer(text)), repeats)
    return {"input": name, "chars": len(text), "seconds_1x": round(one, 4), "seconds_2x": round(two, 4),
            "growth": round(two / one, 2) if one >= MEASURABLE_S else None, "scan_seconds_1x": round(scan, 4), "vs_scan": round(one / scan, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = [measure(name, text, extract_answer, args.repeats) for name, text in INPUTS.items()]
    rows.append(measure("plain_number_spaces", " " * 1_000_000 + "1", plain_number, args.repeats))
    print(json.dumps({"benchmark": "answers", "repeats": args.repeats, "results": rows,
                      "max_growth": max(row["growth"] for row in rows if row["growth"] is not None)}, indent=1))


if __name__ == "__main__":
    main()
