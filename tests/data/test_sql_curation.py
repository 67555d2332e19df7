"""The Spider / BIRD reader of curation: a checked Example per good row, one dead-letter line per bad one.

A row is dead-lettered with its reason when its database is missing, when it has no gold SQL, and when
its gold SQL fails on its own database (run in the SQL sandbox). The example carries its database's
location and checksum, never its bytes.
"""

import hashlib
import json
import shutil

import pytest

from rlax_core.data.formats import FormatError, detect_format, to_example
from rlax_core.data.sql_databases import database_checksum, example_database
from tests.conftest import FIXTURES, REPO_ROOT


@pytest.fixture(scope="module")
def spider(tmp_path_factory):
    """Spider's layout: ``database/<db_id>/<db_id>.sqlite``."""
    root = tmp_path_factory.mktemp("spider")
    (root / "database" / "cities").mkdir(parents=True)
    shutil.copy(FIXTURES / "sql" / "cities.sqlite", root / "database" / "cities" / "cities.sqlite")
    (root / "database" / "cities" / "cities.sqlite").chmod(0o644)
    return root / "database"


def row(**fields):
    return {"db_id": "cities", "question": "How many cities are there?", "query": "SELECT count(*) FROM city",
            **fields}


def test_a_spider_row_becomes_a_checked_sql_example(spider):
    assert detect_format(row()) == "spider" and detect_format({**row(), "SQL": "x"}) == "bird"
    example = to_example("spider", row(hardness="easy"), databases=str(spider), split="train", schema_rows=2)
    meta = json.loads(example["meta"])
    assert (example["task"], example["answer"], example["prompt"]) == ("sql", "SELECT count(*) FROM city",
                                                                       "How many cities are there?")
    assert meta["database"] == str(spider / "cities" / "cities.sqlite") and meta["level"] == "easy"
    assert meta["db_sha256"] == database_checksum(spider / "cities" / "cities.sqlite")
    assert "CREATE TABLE city (" in meta["schema"] and "country TEXT REFERENCES country(code)" in meta["schema"]
    assert "rows of city" in meta["schema"]
    assert example_database(example) == spider / "cities" / "cities.sqlite"


def test_a_bird_row_keeps_its_evidence_as_a_hint(spider):
    raw = {"db_id": "cities", "question": "Which city is largest?", "evidence": "largest refers to max(area)",
           "SQL": "SELECT name FROM city ORDER BY area DESC LIMIT 1", "difficulty": "simple", "question_id": 4}
    example = to_example("auto", raw, databases=str(spider))
    assert example["prompt"] == "Which city is largest?\nHint: largest refers to max(area)"
    assert json.loads(example["meta"])["level"] == "simple" and example["source"] == "bird"


@pytest.mark.parametrize("raw, reason, words", [
    (row(db_id="atlantis"), "missing_database", "no database for db_id 'atlantis'"),
    (row(query=""), "missing_gold_sql", "no gold SQL"),
    ({"db_id": "cities", "question": "?"}, "missing_gold_sql", "no gold SQL"),
    (row(query="SELECT population FROM town"), "gold_sql_fails", "no such table: town"),
    (row(query="DELETE FROM city"), "gold_sql_fails", "refused"),
    (row(query="WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 20000) SELECT x FROM n"),
     "gold_sql_fails", "more than 10000 rows"),
    (row(db_id="../cities"), "missing_database", "not a plain name"),
])
def test_bad_rows_are_dead_lettered_with_their_reason_in_one_line(spider, raw, reason, words):
    with pytest.raises(FormatError) as caught:
        to_example("spider", raw, databases=str(spider))
    assert caught.value.reason == reason and words in caught.value.detail and "\n" not in caught.value.detail


def test_an_evaluation_set_is_read_for_its_questions_without_a_database():
    example = to_example("auto", row(db_id="anywhere"), prompts_only=True)
    assert example["prompt"] == "How many cities are there?" and example["task"] == "sql"


def test_a_spider_row_without_its_folder_of_databases_is_dead_lettered():
    with pytest.raises(FormatError) as caught:
        to_example("spider", row())
    assert caught.value.reason == "missing_database" and "databases" in caught.value.detail


def test_the_shipped_task_reads_flat_and_every_gold_query_runs():
    folder = REPO_ROOT / "pipelines" / "assets" / "sql_tiny"
    rows = json.loads((folder / "heldout.json").read_text())
    levels = {r["difficulty"] for r in rows}
    assert levels == {"1_single_table", "2_join", "3_grouping", "4_nesting"}
    for raw in rows[::6]:  # a sample: every row's gold query ran when the task was built
        example = to_example("spider", raw, databases=str(folder), source="sql_tiny")
        assert json.loads(example["meta"])["database"] == str(folder / f"{raw['db_id']}.sqlite")


def test_a_database_in_storage_is_fetched_once_by_its_checksum_and_a_changed_one_is_refused(tmp_path):
    import fsspec

    from rlax_core.data.sql_databases import local_database
    from rlax_core.sandbox.sql import DatabaseError

    data = (FIXTURES / "sql" / "cities.sqlite").read_bytes()
    url = "memory://sql-test-bucket/database/cities/cities.sqlite"
    with fsspec.open(url, "wb") as handle:
        handle.write(data)
    sha = hashlib.sha256(data).hexdigest()
    path = local_database(url, sha, cache_dir=str(tmp_path / "cache"))
    assert path == tmp_path / "cache" / f"{sha}.sqlite" and path.read_bytes() == data
    assert path.stat().st_mode & 0o777 == 0o644  # the sandbox's unprivileged uid reads it
    fsspec.filesystem("memory").rm(url)  # fetched once: the cached copy serves from now on
    assert local_database(url, sha, cache_dir=str(tmp_path / "cache")) == path
    with pytest.raises(DatabaseError, match="has changed since curation"):
        local_database(str(path), "0" * 64)
    with pytest.raises(DatabaseError, match="does not exist"):
        local_database("memory://sql-test-bucket/database/gone.sqlite", None, cache_dir=str(tmp_path / "cache"))


def test_a_database_under_a_path_with_uri_characters_opens(tmp_path):
    from rlax_core.sandbox.sql import run_query
    from rlax_core.tasks.sql import serialize_schema

    path = tmp_path / "odd ?#% name" / "cities.sqlite"
    path.parent.mkdir()
    shutil.copy(FIXTURES / "sql" / "cities.sqlite", path)
    path.chmod(0o644)
    assert run_query(path, "SELECT count(*) FROM country").rows == ((3,),)
    assert serialize_schema(path).startswith("CREATE TABLE country (")
