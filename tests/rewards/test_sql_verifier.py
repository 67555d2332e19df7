"""The ``sql`` reward term on the database in tests/fixtures/sql: what matches, what does not, and why.

Results compare as multisets of rows (order only where the gold query orders at its top level),
numbers within a relative tolerance, NULL equal to NULL (docs/sql.md). Every check runs the query in
the SQL sandbox, as training does.
"""

import json
import shutil

import pytest

from rlax_core.rewards import RewardConfig, Rewarder, Sample
from rlax_core.rewards.sql_match import SqlRewardConfig, extract_sql, orders_rows, results_match
from tests.conftest import FIXTURES


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    path = tmp_path_factory.mktemp("sql") / "cities.sqlite"
    shutil.copy(FIXTURES / "sql" / "cities.sqlite", path)
    path.chmod(0o644)  # the sandbox reads it as an unprivileged user, whatever the clone's umask was
    return path


@pytest.fixture(scope="module")
def rewarder():
    config = RewardConfig(terms={"sql": 1.0}, sql=SqlRewardConfig(executes_credit=0.1, unparsable_penalty=-1.0))
    with Rewarder(config) as scorer:
        yield scorer


def example(database, gold: str) -> dict:
    return {"id": "q", "task": "sql", "prompt": "?", "answer": gold, "meta": json.dumps({"database": str(database)})}


def score(rewarder, database, gold: str, query: str):
    reward, info = rewarder(example(database, gold), f"Here it is:\n```sql\n{query}\n```")
    return reward, info["pass"], info["terms"]["sql"]


def test_different_sql_with_the_same_result_passes(rewarder, database):
    gold = "SELECT name FROM city WHERE population > 1000000"
    for query in ("SELECT name FROM city WHERE NOT population <= 1000000",
                  "SELECT c.name FROM city c JOIN country k ON k.code = c.country WHERE c.population > 1e6",
                  "SELECT name FROM city WHERE id IN (SELECT id FROM city WHERE population > 1000000)"):
        reward, passed, info = score(rewarder, database, gold, query)
        assert (reward, passed, info["reason"]) == (1.0, True, "match"), (query, info)


def test_a_different_result_fails_with_the_credit_for_running(rewarder, database):
    gold = "SELECT name FROM city WHERE population > 1000000"
    for query in ("SELECT name FROM city WHERE population > 500000",  # a row more
                  "SELECT name, population FROM city WHERE population > 1000000",  # a column more
                  "SELECT upper(name) FROM city WHERE population > 1000000"):  # other values
        reward, passed, info = score(rewarder, database, gold, query)
        assert (reward, passed, info["reason"]) == (0.1, False, "different_result"), (query, info)


def test_duplicates_count_rows_are_a_multiset(rewarder, database):
    gold = "SELECT country FROM city"
    assert score(rewarder, database, gold, "SELECT DISTINCT country FROM city")[1] is False
    assert score(rewarder, database, gold, "SELECT country FROM city ORDER BY country DESC")[1] is True


def test_order_counts_only_where_the_gold_query_orders_at_its_top_level(rewarder, database):
    unordered = "SELECT name FROM city WHERE country = 'NO'"
    assert score(rewarder, database, unordered, "SELECT name FROM city WHERE country = 'NO' ORDER BY name DESC")[1]
    ordered = "SELECT name FROM city WHERE country = 'NO' ORDER BY population DESC"
    assert score(rewarder, database, ordered, "SELECT name FROM city WHERE country = 'NO' ORDER BY population DESC")[1]
    reward, passed, info = score(rewarder, database, ordered, "SELECT name FROM city WHERE country = 'NO' ORDER BY name")
    assert not passed and info["ordered"] is True
    inner = "SELECT name FROM (SELECT name FROM city ORDER BY population DESC LIMIT 3)"  # orders a subquery only
    assert score(rewarder, database, inner, "SELECT name FROM city ORDER BY population DESC LIMIT 3")[1]
    assert not orders_rows("SELECT rank() OVER (ORDER BY area) FROM city WHERE name = 'order by'")
    assert orders_rows("SELECT name FROM city -- no order\n ORDER BY 1")


def test_numbers_match_within_the_tolerance_and_nulls_match_nulls(rewarder, database):
    assert score(rewarder, database, "SELECT avg(area) FROM city", "SELECT sum(area) / count(area) FROM city")[1]
    assert score(rewarder, database, "SELECT count(*) FROM city", "SELECT count(*) * 1.0 FROM city")[1]  # 7 == 7.0
    assert not score(rewarder, database, "SELECT avg(area) FROM city", "SELECT round(avg(area), 1) FROM city")[1]
    assert score(rewarder, database, "SELECT name, mayor FROM city", "SELECT name, mayor FROM city ORDER BY mayor")[1]
    assert not score(rewarder, database, "SELECT mayor FROM city", "SELECT coalesce(mayor, '') FROM city")[1]
    assert not score(rewarder, database, "SELECT mayor FROM city", "SELECT coalesce(mayor, 0) FROM city")[1]
    assert results_match([(1.0 + 1e-9, "b"), (1.0, "a")], [(1.0, "b"), (1.0 + 1e-9, "a")], ordered=False)
    assert not results_match([("1",)], [(1,)], ordered=False)  # text is not a number


def test_no_query_or_an_unparsable_one_takes_the_penalty(rewarder, database):
    reward, info = rewarder(example(database, "SELECT 1"), "I do not know.")
    assert (reward, info["terms"]["sql"]["reason"]) == (-1.0, "no_query")
    reward, passed, info = score(rewarder, database, "SELECT 1", "SELEC name FROM city")
    assert (reward, passed, info["reason"]) == (-1.0, False, "syntax_error")


def test_the_final_query_is_the_last_sql_block():
    text = "First ```sql\nSELECT 1\n``` then\n```sql\nSELECT name FROM city;\n```"
    assert extract_sql(text) == "SELECT name FROM city"
    assert extract_sql("The answer:\nSELECT a FROM t;") == "SELECT a FROM t"
    assert extract_sql("no query here") is None


def test_gold_results_are_computed_once_per_database_and_query(database):
    config = RewardConfig(terms={"sql": 1.0})
    with Rewarder(config) as scorer:
        verifier = scorer.terms["sql"].verifier
        gold = "SELECT count(*) FROM city"
        results = scorer.score_many([Sample(example(database, gold), f"```sql\nSELECT {n}\n```") for n in (7, 6, 7, 7)])
        assert [info["pass"] for _, info in results] == [True, False, True, True]
        assert verifier.gold_runs == 1


def test_bad_examples_fail_alone_with_one_line(rewarder, database, tmp_path):
    missing = example(tmp_path / "gone.sqlite", "SELECT 1")
    no_gold = example(database, "")
    good = example(database, "SELECT count(*) FROM country")
    failing_gold = example(database, "SELECT nope FROM city")
    results = rewarder.score_many([Sample(e, "```sql\nSELECT 3\n```") for e in (missing, no_gold, good, failing_gold)])
    errors = [info.get("scoring_error", "") for _, info in results]
    assert "does not exist" in errors[0] and "gone.sqlite" in errors[0]
    assert "no gold SQL" in errors[1]
    assert results[2][1]["pass"] is True and not errors[2]
    assert "gold query fails" in errors[3] and "no such column" in errors[3]
    assert all("\n" not in error for error in errors)


def test_a_result_past_the_row_cap_does_not_match(database):
    from rlax_core.sandbox.sql import SqlLimits

    config = RewardConfig(terms={"sql": 1.0}, sql=SqlRewardConfig(limits=SqlLimits(max_rows=5)))
    with Rewarder(config) as scorer:
        reward, info = scorer(example(database, "SELECT name FROM city LIMIT 3"), "```sql\nSELECT name FROM city\n```")
    assert reward == 0.0 and info["terms"]["sql"]["reason"] == "row_cap" and info["terms"]["sql"]["more"] is True


def test_the_task_term_scores_sql_examples_by_execution(database):
    with Rewarder(RewardConfig(terms={"task": 1.0})) as scorer:
        reward, info = scorer(example(database, "SELECT count(*) FROM city"), "```sql\nSELECT count(id) FROM city\n```")
    assert reward == 1.0 and info["pass"] and info["terms"]["task"]["reason"] == "match"
