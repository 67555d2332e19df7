"""The ``sql`` reward term: execution match of the completion's final query against the gold query.

Both queries run on the example's database in the SQL sandbox (``rlax_core.sandbox.sql``), each in a
process of its own; the gold query's result is computed once per (database checksum, gold query) and
cached. The score (``SqlRewardConfig``):

* 1 when the results match, and ``pass`` is true;
* ``executes_credit`` (0 by default; Arctic-Text2SQL-R1 uses 0.1) when the query runs but its result differs;
* ``unparsable_penalty`` (0 by default; SkyRL-SQL uses -1) when the completion holds no query, or
  SQLite cannot parse it;
* 0 for every other failure: refused (``ATTACH``, a write, a file-reading function), past its
  deadline, over its memory or row cap, or a sandbox that died; ``reason`` names which.

Results match as multisets of rows (the order counts only when the gold query has an ``ORDER BY`` at its
top level), with the columns in order; numbers are equal within a relative tolerance
(``float_tolerance``, and an int equals the same float), NULL equals NULL, text and blobs compare exactly.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import re
import threading
from collections import OrderedDict
from typing import Any, Sequence

from rlax_core.config import require
from rlax_core.data.sql_databases import DEFAULT_CACHE, database_checksum, example_database
from rlax_core.rewards.registry import (SCORER_UNAVAILABLE, RewardResult, RewardTerm, Sample, register_reward,
                                       scoring_failure)
from rlax_core.sandbox.sql import DatabaseError, SqlLimits, SqlOutcome, run_query

UNPARSABLE = ("no_query", "syntax_error")
# The last ```sql block; else the last fenced block of any language. Linear: no nested unbounded runs.
_SQL_FENCE = re.compile(r"```[ \t]*(?:sql|sqlite)[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)
_ANY_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_BARE_QUERY = re.compile(r"^[ \t]*(?:SELECT|WITH)\b", re.IGNORECASE | re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class SqlRewardConfig:
    """The ``rewards.sql`` section: the sandbox's limits, the score's parts and the comparison."""

    workers: int = 2  # sandboxed queries at once
    limits: SqlLimits = dataclasses.field(default_factory=SqlLimits)
    executes_credit: float = 0.0  # a query that runs with a different result
    unparsable_penalty: float = 0.0  # no query, or one SQLite cannot parse (a negative number is a penalty)
    float_tolerance: float = 1e-6  # relative; numbers closer than 1e-9 are equal whatever their size
    gold_cache_entries: int = 4096  # gold results kept per process
    cache_dir: str = DEFAULT_CACHE  # where databases from storage (gs://) are fetched to, once

    def __post_init__(self):
        require(self.workers >= 1, "workers", "must be >= 1")
        require(0.0 <= self.executes_credit < 1.0, "executes_credit", "in [0, 1): a match must pay more")
        require(-1.0 <= self.unparsable_penalty <= 0.0, "unparsable_penalty", "in [-1, 0]")
        require(0.0 <= self.float_tolerance < 1.0, "float_tolerance", "in [0, 1)")
        require(self.gold_cache_entries >= 1, "gold_cache_entries", "must be >= 1")


def extract_sql(completion: str) -> str | None:
    """The completion's final query: its last ```sql block, else its last fenced block, else the text
    from its last line that starts with SELECT or WITH; None when there is none."""
    for pattern in (_SQL_FENCE, _ANY_FENCE):
        blocks = [b.strip() for b in pattern.findall(completion) if b.strip()]
        if blocks:
            return _one_statement(blocks[-1])
    starts = [m.start() for m in _BARE_QUERY.finditer(completion)]
    return _one_statement(completion[starts[-1]:]) if starts else None


def _one_statement(text: str) -> str | None:
    text = text.strip().rstrip(";").strip()
    return text or None


def _strip_literals(sql: str) -> str:
    """The query with string literals, quoted names and comments blanked (they may hold any word)."""
    return re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|`[^`]*`|\[[^\]]*\]|--[^\n]*|/\*.*?\*/", " ", sql, flags=re.DOTALL)


def orders_rows(sql: str) -> bool:
    """True when the query has ``ORDER BY`` at its top level (not inside a subquery or a window)."""
    depth, text = 0, _strip_literals(sql)
    for match in re.finditer(r"\(|\)|\border\s+by\b", text, re.IGNORECASE):
        token = match.group()
        if token == "(":
            depth += 1
        elif token == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            return True
    return False


def values_equal(gold: Any, other: Any, tolerance: float) -> bool:
    numeric = (int, float)
    if type(gold) in numeric and type(other) in numeric:
        if type(gold) is int and type(other) is int:
            return gold == other
        return math.isclose(float(gold), float(other), rel_tol=tolerance, abs_tol=1e-9) or gold == other
    return type(gold) is type(other) and gold == other  # None == None; text and blobs exactly


def _rows_equal(gold: Sequence, other: Sequence, tolerance: float) -> bool:
    return len(gold) == len(other) and all(values_equal(g, o, tolerance) for g, o in zip(gold, other))


def _sort_key(row: Sequence) -> tuple:
    # NULL < numbers < text < blobs, as SQLite orders them; a total order over the mixed types.
    rank = {type(None): 0, int: 1, float: 1, str: 2, bytes: 3}
    return tuple((rank[type(v)], v if v is not None else 0) for v in row)


def results_match(gold: Sequence[Sequence], other: Sequence[Sequence], ordered: bool, tolerance: float = 1e-6) -> bool:
    """``other`` holds the same rows as ``gold`` (as a multiset, or in order when ``ordered``)."""
    if len(gold) != len(other):
        return False
    if ordered:
        return all(_rows_equal(g, o, tolerance) for g, o in zip(gold, other))
    gold_sorted, other_sorted = sorted(gold, key=_sort_key), sorted(other, key=_sort_key)
    if all(_rows_equal(g, o, tolerance) for g, o in zip(gold_sorted, other_sorted)):
        return True
    if not any(type(v) is float for row in gold for v in row) or len(gold) > 2000:
        return False  # exact values sort the same: the sorted pass was the answer
    # Values within the tolerance may sort apart: match each gold row to an unused equal row.
    unused = list(other_sorted)
    for row in gold_sorted:
        index = next((i for i, o in enumerate(unused) if _rows_equal(row, o, tolerance)), None)
        if index is None:
            return False
        unused.pop(index)
    return True


@dataclasses.dataclass(frozen=True)
class GoldResult:
    outcome: SqlOutcome
    ordered: bool


class SqlVerifier:
    """Runs completions' queries against their examples' gold results; gold results are cached."""

    def __init__(self, config: SqlRewardConfig = SqlRewardConfig()):
        self.config = config
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="sql-verifier")
        self._gold: OrderedDict[tuple[str, str], concurrent.futures.Future] = OrderedDict()
        self._lock = threading.Lock()
        self.gold_runs = 0  # gold queries actually run (the rest came from the cache)

    def gold(self, database, gold_sql: str) -> GoldResult:
        """The gold query's result on ``database``, run once per (database checksum, query) in this process."""
        key = (database_checksum(database), gold_sql)
        with self._lock:
            future = self._gold.get(key)
            owner = future is None
            if owner:
                future = self._gold[key] = concurrent.futures.Future()
                self.gold_runs += 1
                while len(self._gold) > self.config.gold_cache_entries:
                    self._gold.popitem(last=False)
            else:
                self._gold.move_to_end(key)
        if owner:
            try:
                future.set_result(GoldResult(run_query(database, gold_sql, self.config.limits), orders_rows(gold_sql)))
            except BaseException as error:
                with self._lock:
                    self._gold.pop(key, None)  # not cached: the next sample tries again
                future.set_exception(error)
        return future.result()

    def check(self, example, completion: str) -> RewardResult:
        gold_sql = example.get("answer")
        if not gold_sql or not str(gold_sql).strip():
            return scoring_failure(f"example {example.get('id', '?')!r} has no gold SQL ('answer')")
        try:
            database = example_database(example, self.config.cache_dir)
            gold = self.gold(database, str(gold_sql))
        except (DatabaseError, ValueError) as error:
            return scoring_failure(str(error))
        if not gold.outcome.ok:
            return scoring_failure(f"the gold query fails on its database: {gold.outcome.reason}: {gold.outcome.detail}")
        if gold.outcome.more:
            return scoring_failure(f"the gold query returns more than {self.config.limits.max_rows} rows (the row cap)")
        query = extract_sql(completion)
        if query is None:
            return RewardResult(self.config.unparsable_penalty, {"pass": False, "reason": "no_query", "query": None})
        outcome = run_query(database, query, self.config.limits)
        info = {"query": query[:500], **outcome.info(), "ordered": gold.ordered}
        if not outcome.ok:
            score = self.config.unparsable_penalty if outcome.reason in UNPARSABLE else 0.0
            return RewardResult(score, {"pass": False, **info})
        matched = (not outcome.more
                   and results_match(gold.outcome.rows, outcome.rows, gold.ordered, self.config.float_tolerance))
        info["reason"] = "match" if matched else ("row_cap" if outcome.more else "different_result")
        return RewardResult(1.0 if matched else self.config.executes_credit, {"pass": matched, **info})

    def submit(self, example, completion: str) -> concurrent.futures.Future:
        return self._pool.submit(self.check, example, completion)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@register_reward("sql")
class SqlExecutionMatch(RewardTerm):
    """Execution match of the completion's final SQL query with the example's gold query (module docstring)."""

    def __init__(self, config):
        super().__init__(config)
        self.verifier = SqlVerifier(config.sql)

    def score_many(self, samples: Sequence[Sample]) -> list[RewardResult]:
        futures = [self.verifier.submit(sample.example, sample.completion) for sample in samples]
        results = []
        for future in futures:
            try:
                results.append(future.result())
            except SCORER_UNAVAILABLE:
                raise
            except Exception as error:  # noqa: BLE001 - this sample's check broke: its reward alone is 0
                results.append(scoring_failure(f"{type(error).__name__}: {error}"))
        return results

    def close(self) -> None:
        self.verifier.close()
