"""The ``sql`` environment: exploratory queries see truncated results; the final query alone is scored."""

import hashlib
import json
import shutil

import pytest

from rlax_core.config import ConfigError
from rlax_core.envs import EnvConfig, make_environment
from tests.conftest import FIXTURES

GOLD = "SELECT name FROM city WHERE country = 'NO' ORDER BY population DESC"


@pytest.fixture(scope="module")
def row(tmp_path_factory):
    database = tmp_path_factory.mktemp("sql-env") / "cities.sqlite"
    shutil.copy(FIXTURES / "sql" / "cities.sqlite", database)
    database.chmod(0o644)
    return {"id": "q1", "task": "sql", "prompt": "List the Norwegian cities, largest first.", "answer": GOLD,
            "meta": json.dumps({"database": str(database)})}


def config(**options):
    return EnvConfig(name="sql", tools=(), max_turns=4, judge_answer=False, options={"rows_shown": 3, **options})


def play(row, turns):
    env = make_environment(config(), row)
    prompt = env.reset()
    results = [env.step(text) for text in turns]
    return prompt, results


def test_an_episode_explores_then_answers_and_is_scored_by_its_final_query(row):
    prompt, results = play(row, ["Let me look. <sql>SELECT * FROM city</sql>",
                                 "And the countries: <sql>SELECT code FROM country WHERE name = 'Norway'</sql>",
                                 f"Final:\n```sql\n{GOLD}\n```"])
    assert "CREATE TABLE city (" in prompt and "<sql>...</sql>" in prompt and "Question: List the Norwegian" in prompt
    assert make_environment(config(), row).stop_strings == ("</sql>",)  # an exploratory query ends its turn
    first, second, final = results
    assert not first.done and first.reward == 0.0 and first.info["pass"] is False
    assert first.observation.startswith("\n<result>\nid | name | country") and "Oslo" in first.observation
    assert "(only the first 3 rows are shown)" in first.observation and "Cusco" not in first.observation  # row 4 of 7
    assert "NO" in second.observation
    assert final.done and final.reward == 1.0 and final.info["pass"] is True and final.info["explored"] == 2


def test_exploring_with_the_right_query_earns_nothing_without_the_right_answer(row):
    _, results = play(row, [f"<sql>{GOLD}</sql>", "```sql\nSELECT name FROM city WHERE country = 'NO' ORDER BY name\n```"])
    assert "Oslo" in results[0].observation
    assert results[-1].done and results[-1].reward == 0.0 and results[-1].info["pass"] is False
    assert results[-1].info["reason"] == "different_result"  # the gold orders its rows; this answer does not


def test_a_hostile_exploration_is_answered_with_its_refusal_and_changes_nothing(row):
    path = json.loads(row["meta"])["database"]
    before = hashlib.sha256(open(path, "rb").read()).hexdigest()
    _, results = play(row, ["<sql>DELETE FROM city</sql>", "<sql>ATTACH '/etc/passwd' AS x</sql>",
                            f"```sql\n{GOLD}\n```"])
    assert "error: refused: not allowed: DELETE city" in results[0].observation
    assert "ATTACH" in results[1].observation
    assert results[-1].reward == 1.0 and hashlib.sha256(open(path, "rb").read()).hexdigest() == before


def test_a_last_turn_that_still_explores_ends_the_episode_without_an_answer(row):
    env = make_environment(EnvConfig(name="sql", tools=(), max_turns=2, judge_answer=False), row)
    env.reset()
    assert not env.step("<sql>SELECT 1</sql>").done
    last = env.step("<sql>SELECT 2</sql>")
    assert last.done and last.info["reason"] == "no_answer" and last.info["pass"] is False


def test_an_unknown_option_is_refused_in_one_line(row):
    with pytest.raises(ConfigError, match="unknown sql environment option"):
        make_environment(config(row_cap=5), row)


@pytest.mark.slow  # an engine with room for the schema's ~450 tokens: its programs compile first
def test_sql_episodes_run_on_the_engine_and_end_scored(stories, row):
    from rlax_core.envs import EpisodeStart, run_episodes
    from rlax_core.inference.config import EngineConfig, SamplingParams
    from rlax_core.inference.engine import Engine

    model, tokenizer = stories
    engine = Engine(EngineConfig(num_slots=4, page_size=16, num_pages=160, max_prompt_len=480, max_new_tokens=32,
                                 prefill_buckets=(480,), attention_impl="window"),
                    model.config, model.params, detokenize=tokenizer.decode)
    config = EnvConfig(name="sql", tools=(), max_turns=2, max_turn_tokens=16, max_tokens=512, judge_answer=False)
    [episode, *_] = run_episodes(engine, tokenizer, config, [EpisodeStart(row, "q", seed=1, samples=2)],
                                 SamplingParams(temperature=1.0, max_new_tokens=16))
    assert episode.turns and not episode.error
    last = episode.turns[-1]
    assert last["info"]["pass"] is False and last["reward"] == 0.0  # stories260K writes no SQL
    assert sum(episode.policy_mask) > 0 and len(episode.policy_mask) == len(episode.completion_ids)
