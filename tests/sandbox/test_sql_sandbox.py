"""Hostile queries against the SQL sandbox: each scores 0 with its reason named, within its deadline,
leaves the database's bytes as they were, and leaves the scorer working for the next sample.

The queries are what a policy under RL finds: ATTACH, load_extension, writes, PRAGMAs that set
something, a recursive CTE with no end, a million-row cross join, and every way SQLite has to read a
file (the gold query's among them). docs/sql.md's threat model lists the guards each one meets.
"""

import hashlib
import json
import shutil
import time

import pytest

from rlax_core.rewards import RewardConfig, Rewarder, Sample
from rlax_core.rewards.sql_match import SqlRewardConfig
from rlax_core.sandbox.run import MIB, SandboxLimits
from rlax_core.sandbox.sql import SqlLimits, run_query
from tests.conftest import FIXTURES

DEADLINE_S = 1.0
LIMITS = SqlLimits(deadline_s=DEADLINE_S, max_rows=1000, heap_bytes=32 * MIB,
                   sandbox=SandboxLimits(cpu_seconds=4, wall_seconds=4.0, memory_bytes=256 * MIB, file_bytes=MIB,
                                         workdir_bytes=4 * MIB, processes=1))
GOLD = "SELECT name FROM city WHERE population > 1000000"
NUMBERS = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000) "

# (query, the reason its outcome must name, a word the detail must hold)
HOSTILE = {
    "attach": ("ATTACH DATABASE '{examples}' AS leak", "refused", "ATTACH"),
    "attach_memory": ("ATTACH ':memory:' AS scratch", "refused", "ATTACH"),
    "detach": ("DETACH DATABASE main", "refused", "DETACH"),
    "load_extension": ("SELECT load_extension('/usr/lib/x86_64-linux-gnu/libsqlite3.so.0')", "refused", "load_extension"),
    "insert": ("INSERT INTO city (name) VALUES ('Atlantis')", "refused", "INSERT"),
    "update": ("UPDATE city SET population = 0", "refused", "UPDATE"),
    "delete": ("DELETE FROM city", "refused", "DELETE"),
    "drop": ("DROP TABLE city", "refused", "not allowed"),
    "create_temp": ("CREATE TEMP TABLE stash AS SELECT * FROM city", "refused", "not allowed"),
    "pragma_query_only": ("PRAGMA query_only = 0", "refused", "query_only"),
    "pragma_journal": ("PRAGMA journal_mode = DELETE", "refused", "journal_mode"),
    "pragma_writable_schema": ("PRAGMA writable_schema = ON", "refused", "writable_schema"),
    "vacuum_into": ("VACUUM INTO '/tmp/copy.sqlite'", "refused", "not allowed"),
    "endless_cte": ("WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n",
                    "timeout", "deadline"),
    "cross_join_count": (NUMBERS + "SELECT count(*) FROM n a, n b, n c", "timeout", "deadline"),
    "readfile_gold": ("SELECT readfile('{examples}')", "error", "readfile"),
    "writefile": ("SELECT writefile('/tmp/x', 'y')", "error", "writefile"),
    "fts3_tokenizer": ("SELECT fts3_tokenizer('simple')", "refused", "fts3_tokenizer"),
    "begin": ("BEGIN IMMEDIATE", "refused", "TRANSACTION"),
    "two_statements": ("SELECT 1; DELETE FROM city", "error", "one statement"),
}


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sql-hostile")
    database = folder / "cities.sqlite"
    shutil.copy(FIXTURES / "sql" / "cities.sqlite", database)
    database.chmod(0o644)
    examples = folder / "examples.jsonl"  # what a policy would love to read: the gold query
    examples.write_text(json.dumps({"answer": GOLD}) + "\n")
    examples.chmod(0o644)
    return database, examples


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_query_is_refused_named_in_time_and_changes_nothing(setting, name):
    database, examples = setting
    query, reason, word = HOSTILE[name]
    before = digest(database)
    started = time.monotonic()
    outcome = run_query(database, query.format(examples=examples), LIMITS)
    elapsed = time.monotonic() - started
    assert outcome.reason == reason and word.lower() in outcome.detail.lower(), outcome
    assert elapsed < DEADLINE_S + 3.0, f"{name} took {elapsed:.1f} s"
    assert digest(database) == before
    assert run_query(database, "SELECT count(*) FROM city", LIMITS).rows == ((7,),)  # the next query works


def test_a_million_row_cross_join_stops_at_the_row_cap(setting):
    database, _ = setting
    started = time.monotonic()
    outcome = run_query(database, NUMBERS + "SELECT a.x, b.x FROM n a, n b", LIMITS)
    assert outcome.ok and outcome.more and len(outcome.rows) == LIMITS.max_rows
    assert time.monotonic() - started < DEADLINE_S + 3.0


def test_a_query_past_its_memory_cap_fails_as_memory(setting):
    database, _ = setting
    limits = SqlLimits(deadline_s=3.0, heap_bytes=16 * MIB, max_value_bytes=512 * MIB, sandbox=LIMITS.sandbox)
    outcome = run_query(database, NUMBERS + "SELECT length(group_concat(hex(randomblob(100000)))) FROM n", limits)
    assert outcome.reason == "memory", outcome


def test_the_sandbox_sees_no_file_but_its_database(setting):
    database, examples = setting
    # The one file a query reaches is its database, bound read-only where the sandbox puts it.
    outcome = run_query(database, "PRAGMA table_list", LIMITS)
    assert outcome.ok and str(examples) not in repr(outcome.rows)
    outcome = run_query(database, "SELECT * FROM pragma_database_list", LIMITS)
    assert not outcome.ok or all(str(database.parent) not in str(row) for row in outcome.rows), outcome


def test_hostile_samples_score_zero_alone_and_the_scorer_goes_on(setting):
    database, examples = setting
    example = {"id": "q", "task": "sql", "prompt": "?", "answer": GOLD, "meta": json.dumps({"database": str(database)})}
    before = digest(database)
    texts = [f"```sql\n{query.format(examples=examples)}\n```" for query, _, _ in HOSTILE.values()]
    texts.append(f"```sql\n{GOLD}\n```")
    config = RewardConfig(terms={"sql": 1.0}, sql=SqlRewardConfig(workers=2, limits=LIMITS, executes_credit=0.1))
    with Rewarder(config) as rewarder:
        results = rewarder.score_many([Sample(example, text) for text in texts])
    *hostile, honest = results
    assert all(reward == 0.0 and not info["pass"] and info["terms"]["sql"]["reason"] == expected
               for (reward, info), (_, expected, _) in zip(hostile, HOSTILE.values())), hostile
    assert honest[0] == 1.0 and honest[1]["pass"]
    assert digest(database) == before


def test_a_sandbox_killed_from_outside_fails_its_query_alone_named(setting):
    database, _ = setting
    # The CPU limit (1 s) ends the process long before SQLite's own deadline: the sandbox names it.
    limits = SqlLimits(deadline_s=20.0, heap_bytes=32 * MIB,
                       sandbox=SandboxLimits(cpu_seconds=1, wall_seconds=25.0, memory_bytes=256 * MIB,
                                             processes=1))
    outcome = run_query(database, HOSTILE["endless_cte"][0], limits)
    assert outcome.reason == "timeout" and "died of SIG" in outcome.detail, outcome
    assert run_query(database, "SELECT count(*) FROM city", LIMITS).rows == ((7,),)
