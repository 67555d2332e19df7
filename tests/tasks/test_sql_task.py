"""The shipped text-to-SQL task: its seeded builder remakes the shipped files, and its prompt shows the schema."""

import json
import sqlite3

from rlax_core.data.formats import to_example
from rlax_core.tasks.prompts import prompt_format
from rlax_core.tasks.sql_tiny import build
from tests.conftest import REPO_ROOT

SHIPPED = REPO_ROOT / "pipelines" / "assets" / "sql_tiny"


def _tables(path):
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        names = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
        return {name: db.execute(f"SELECT * FROM {name} ORDER BY rowid").fetchall() for name in names}


def test_the_seeded_builder_remakes_the_shipped_task(tmp_path):
    counts = build(tmp_path)
    assert counts == {"train": len(json.loads((SHIPPED / "train.json").read_text())),
                      "heldout": len(json.loads((SHIPPED / "heldout.json").read_text()))}
    for name in ("train.json", "heldout.json"):
        assert (tmp_path / name).read_text() == (SHIPPED / name).read_text()
    for name in ("shop.sqlite", "school.sqlite"):
        assert _tables(tmp_path / name) == _tables(SHIPPED / name)
    assert (SHIPPED / "LICENSE").is_file() and "python -m rlax_core.tasks.sql_tiny" in (SHIPPED / "README.md").read_text()


def test_the_prompt_shows_the_schema_then_the_question_and_asks_for_a_sql_block():
    raw = json.loads((SHIPPED / "heldout.json").read_text())[0]
    example = to_example("spider", raw, databases=str(SHIPPED))
    text = prompt_format("sql").text(example)
    assert text.startswith("Database schema:\nCREATE TABLE")
    assert f"Question: {raw['question']}" in text and text.endswith("in a single ```sql code block.")
    assert text.index("CREATE TABLE") < text.index("Question:")
