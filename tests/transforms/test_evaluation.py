"""BuildReport: per-prompt results -> report.json / report.md / PNGs with the right numbers."""

import json

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

from transforms.evaluation import BuildReport


def _row(model, correct, answers, subject="Algebra", level=2, skipped=None):
    return {"model": model, "dataset": "math500", "id": f"{model}-{len(correct)}-{sum(correct)}", "subject": subject,
            "level": level, "correct": correct, "answers": answers, "lengths": [10] * len(correct),
            "skipped": skipped}


def _summary(files):
    files = dict(files)
    report = json.loads(files["report.json"])
    overall = {m: d["math500"]["overall"] for m, d in report["models"].items()}
    return (sorted(files), {m: (o["pass@1"], o["pass@2"], o["maj@2"], o["prompts"]) for m, o in overall.items()},
            report["skipped"], "| math500 | a |" in files["report.md"].decode(), files["pass_at_k.png"][:4])


def test_report_files_and_numbers(pipeline):
    rows = [_row("a", [True, False], ["1", "2"]), _row("a", [False, False], ["3", "3"]),
            _row("b", [True, True], ["1", "1"]), _row("b", [], [], skipped="too long")]
    with pipeline as p:
        files = p | beam.Create(rows) | BuildReport(ks=(1, 2), title="t")
        assert_that(files | beam.combiners.ToList() | beam.Map(_summary), equal_to([(
            ["lengths.png", "pass_at_k.png", "report.json", "report.md"],
            {"a": (0.25, 0.5, 0.5, 2), "b": (1.0, 1.0, 1.0, 1)},  # a: maj@2 tie goes to the first answer, "1"
            ["b:b-0-0"], True, b"\x89PNG")]))
