"""Text-to-SQL in the evaluation report: execution accuracy, overall and by difficulty level, per model."""

import pytest

from rlax_core.eval.report import build_report, to_markdown
from rlax_core.eval.verify import Verifier


def _row(model, level, correct):
    return {"model": model, "dataset": "sql_tiny", "task": "sql", "subject": None, "level": level,
            "correct": correct, "answers": [None] * len(correct), "lengths": [20] * len(correct)}


def test_execution_accuracy_by_level_with_models_side_by_side():
    rows = [_row("base", "1_single_table", [True, False]), _row("base", "4_nesting", [False, False]),
            _row("tuned", "1_single_table", [True, True]), _row("tuned", "4_nesting", [True, False])]
    report = build_report(rows, ks=[1, 2])
    base, tuned = (report["models"][m]["sql_tiny"] for m in ("base", "tuned"))
    assert base["overall"]["execution_accuracy"] == pytest.approx(0.25)
    assert tuned["by_level"]["4_nesting"]["execution_accuracy"] == pytest.approx(0.5)
    assert "maj@1" not in base["overall"]  # queries are not voted on
    text = to_markdown(report)
    assert "## Execution accuracy (text-to-SQL)" in text
    assert "| sql_tiny | all | base | 2 | 0.250 |" in text and "| sql_tiny | 1_single_table | tuned | 1 | 1.000 |" in text


def test_a_math_dataset_has_no_execution_accuracy():
    rows = [{**_row("m", None, [True]), "task": "math", "answers": ["1"]}]
    assert "execution_accuracy" not in build_report(rows, ks=[1])["models"]["m"]["sql_tiny"]["overall"]
    assert "Execution accuracy" not in to_markdown(build_report(rows, ks=[1]))


def test_evaluation_verifies_sql_examples_by_execution(tmp_path):
    import json
    import shutil

    from tests.conftest import FIXTURES

    database = tmp_path / "cities.sqlite"
    shutil.copy(FIXTURES / "sql" / "cities.sqlite", database)
    database.chmod(0o644)
    example = {"id": "q", "task": "sql", "prompt": "?", "answer": "SELECT count(*) FROM city",
               "meta": json.dumps({"database": str(database)})}
    verifier = Verifier()
    try:
        verdicts = verifier.verify(example, ["```sql\nSELECT count(id) FROM city\n```", "```sql\nSELECT 1\n```"],
                                   ["stop", "stop"])
    finally:
        verifier.close()
    assert [v.correct for v in verdicts] == [True, False]
