"""``sql``: a text-to-SQL episode in which the policy may explore the database before its final query.

The prompt is the ``sql`` task's (the schema and the question, ``tasks.sql``) and one more line: a
query written inside ``<sql>...</sql>`` runs on the example's database, and its first rows come back
as ``<result>...</result>``. A turn without such a query is the answer: its final query (the last
```sql block, ``rewards.sql_match.extract_sql``) is scored against the gold query by execution match,
and that score alone is the episode's reward. Exploration earns nothing and costs nothing but turns,
so the config sets ``judge_answer: false`` (the run's reward terms would read the whole transcript,
exploratory queries included).

Exploratory queries run in the same SQL sandbox as the reward, with the episode's caps
(``env.options``): ``rows_shown`` rows (the result says how many more there were), ``cell_chars``
characters a value, ``deadline_s`` a query. A turn past ``env.max_turns`` cannot come: the runner
ends the episode there, so a last turn that still explores is scored as an episode with no answer.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Mapping

from rlax_core.config import ConfigError
from rlax_core.data.sql_databases import example_database
from rlax_core.envs.base import Environment, EnvConfig, TurnResult, register_environment
from rlax_core.rewards.sql_match import SqlRewardConfig, SqlVerifier
from rlax_core.sandbox.sql import DatabaseError, SqlLimits, run_query
from rlax_core.tasks.prompts import prompt_format

EXPLORE_OPEN, EXPLORE_CLOSE = "<sql>", "</sql>"
EXPLORE_INSTRUCTION = ("\nBefore answering you may explore the database: write a query inside <sql>...</sql> and its "
                       "first rows will follow inside <result>...</result>.")
_EXPLORE = re.compile(r"<sql>(.*?)</sql>", re.DOTALL | re.IGNORECASE)
OPTIONS = {"rows_shown": 10, "cell_chars": 60, "deadline_s": 5.0, "executes_credit": 0.0, "unparsable_penalty": 0.0}


@functools.cache
def _verifier(config: SqlRewardConfig) -> SqlVerifier:
    """One verifier per process and setting: the gold results it caches serve every episode."""
    return SqlVerifier(config)


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError("options", f"unknown sql environment option(s) {', '.join(unknown)}; known: "
                          f"{', '.join(OPTIONS)}")
    merged = {**OPTIONS, **options}
    if int(merged["rows_shown"]) < 1 or int(merged["cell_chars"]) < 8:
        raise ConfigError("options", "rows_shown must be >= 1 and cell_chars >= 8")
    return merged


@register_environment("sql")
class SqlEnvironment(Environment):
    stop_strings = (EXPLORE_CLOSE,)  # an exploratory query ends its turn: the result comes next

    def __init__(self, config: EnvConfig, row: Mapping[str, Any], tokenizer=None):
        super().__init__(config, row, tokenizer)
        options = _options(config.options)
        self.rows_shown, self.cell_chars = int(options["rows_shown"]), int(options["cell_chars"])
        reward = SqlRewardConfig(executes_credit=float(options["executes_credit"]),
                                 unparsable_penalty=float(options["unparsable_penalty"]))
        self.verifier = _verifier(reward)
        self.explore_limits = SqlLimits(deadline_s=float(options["deadline_s"]), max_rows=self.rows_shown)
        self.explored = 0

    def reset(self) -> str:
        text = prompt_format("sql").text(self.row) + EXPLORE_INSTRUCTION
        if self.tokenizer is not None and getattr(self.tokenizer, "chat_template", None):
            self.add_bos = False
            return self.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True)
        return text + "\n"

    def step(self, text: str, finish_reason: str = "stop") -> TurnResult:
        self.turn += 1
        explore = _EXPLORE.findall(text)
        if explore or (EXPLORE_OPEN in text.lower() and finish_reason == "length"):
            if self.turn >= self.config.max_turns:  # no turn is left for the answer
                return TurnResult(reward=self.verifier.config.unparsable_penalty, done=True,
                                  info={"pass": False, "reason": "no_answer", "explored": self.explored})
            self.explored += 1
            query = explore[-1].strip() if explore else ""
            return TurnResult(observation=f"\n<result>\n{self._result(query)}\n</result>\n",
                              info={"pass": False, "explore": query[:500]})
        reward, info = self.verifier.check(self.row, text)
        return TurnResult(reward=reward, done=True, info={**info, "explored": self.explored})

    def _result(self, query: str) -> str:
        if not query:
            return "error: no query inside <sql>...</sql>"
        try:
            outcome = run_query(example_database(self.row, self.verifier.config.cache_dir), query, self.explore_limits)
        except DatabaseError as error:
            return f"error: {error}"
        if not outcome.ok:
            return f"error: {outcome.reason}: {outcome.detail}"[:500]
        lines = [" | ".join(outcome.columns)]
        lines += [" | ".join(self._cell(v) for v in row) for row in outcome.rows]
        if outcome.more:
            lines.append(f"(only the first {self.rows_shown} rows are shown)")
        return "\n".join(lines)

    def _cell(self, value: Any) -> str:
        text = "NULL" if value is None else (f"<{len(value)} bytes>" if isinstance(value, bytes) else str(value))
        return text if len(text) <= self.cell_chars else text[:self.cell_chars] + "..."
