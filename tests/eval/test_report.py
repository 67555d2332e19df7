"""build_report and to_markdown: breakdowns by subject and level, tasks without votes."""

import pytest

from rlax_core.eval.report import build_report, pass_rate_histogram, plot_report, to_markdown


def _row(model, subject, level, correct, answers=None):
    return {"model": model, "dataset": "d", "subject": subject, "level": level, "correct": correct,
            "answers": answers if answers is not None else [str(c) for c in correct], "lengths": [4, 6][: len(correct)]}


def test_breakdown_by_subject_and_level():
    rows = [_row("m", "Algebra", 1, [True, True]), _row("m", "Algebra", 3, [False, False]),
            _row("m", "Geometry", 3, [True, False])]
    report = build_report(rows, ks=[1, 2])["models"]["m"]["d"]
    assert report["overall"]["pass@1"] == pytest.approx(0.5)
    assert report["by_subject"]["Algebra"]["pass@2"] == pytest.approx(0.5)
    assert report["by_subject"]["Geometry"]["pass@2"] == pytest.approx(1.0)
    assert report["by_level"]["3"]["prompts"] == 2
    assert report["overall"]["length_mean"] == pytest.approx(5.0)
    text = to_markdown(build_report(rows, ks=[1, 2]))
    assert "## By subject" in text and "| d | level 3 | m | 2 |" in text


def test_task_without_answers_has_no_majority_vote():
    rows = [_row("m", None, None, [True, False], answers=[None, None])]
    overall = build_report(rows, ks=[1])["models"]["m"]["d"]["overall"]
    assert "maj@1" not in overall and overall["pass@1"] == 0.5


def test_images_are_png():
    report = build_report([_row("m", "A", 1, [True, False])], ks=[1, 2])
    assert all(data[:4] == b"\x89PNG" for data in plot_report(report).values())
    assert pass_rate_histogram([0.0, 0.5, 1.0], (0.1, 0.9), "t")[:4] == b"\x89PNG"
