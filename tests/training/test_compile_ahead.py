"""Compiling a packed update ahead: a step whose batch falls in a bucket compiled ahead compiles nothing
and takes the same step; a batch no guess covers is told apart; the key is refused where it cannot act."""

import dataclasses
from pathlib import Path

import pytest

from tests.support.compiles import COMPILES
from test_packing import long_tail_groups, trainer

from rlax_core.config import ConfigError
from rlax_core.rl.presets import get_preset
from rlax_core.training.batching import make_batch
from rlax_core.training.compile_ahead import CompileAhead, batch_shape
from rlax_core.training.config import TrainerConfig
from rlax_core.training.packing import real_tokens

ROW_TOKENS = 32
NO_KL = dataclasses.replace(get_preset("grpo"), kl_coef=0.0)  # no reference to hand over


def packed(update, tables):
    return update.pack(make_batch(tables, max_seq_len=32, row_multiple=update.row_multiple))


def test_a_batch_in_a_bucket_compiled_ahead_steps_without_compiling_and_others_are_told_apart(caplog):
    ahead, plain = (trainer(NO_KL, row_tokens=ROW_TOKENS, micro_batch_tokens=2 * ROW_TOKENS) for _ in range(2))
    tables = long_tail_groups()
    batch = packed(ahead, tables)
    rollouts = sum(t.num_rows for t in tables)
    params = plain.init_state().params
    state = ahead.init_state(params)
    compile_ahead = CompileAhead(ahead, state, rollouts, None, [real_tokens(batch) // rollouts])
    assert compile_ahead.shapes == [batch_shape(batch)]  # rows filled whole: the bucket the real packing fills
    assert compile_ahead.wait_for(batch, timeout_s=600)
    before = COMPILES.count
    state_a, metrics_a = ahead.step(state, batch)
    assert COMPILES.count == before  # the step ran what the thread compiled
    state_b, metrics_b = plain.step(plain.init_state(params), packed(plain, tables))
    assert float(metrics_a["loss"]) == float(metrics_b["loss"])
    assert not compile_ahead.wait_for(batch, timeout_s=1)  # each shape is waited for once
    other = packed(ahead, long_tail_groups(groups=2, samples=2))
    with caplog.at_level("INFO", logger="rlax_core.training.compile_ahead"):
        assert batch_shape(other) != batch_shape(batch) and not compile_ahead.wait_for(other, timeout_s=1)
        assert not compile_ahead.wait_for(other, timeout_s=1)
    # The shape no guess made is named once, when a step first meets it (a recipe's next guess).
    named = [r.getMessage() for r in caplog.records if "no compile-ahead guess" in r.getMessage()]
    assert len(named) == 1 and str(batch_shape(other)) in named[0]


def test_the_key_is_refused_for_padded_rows_and_below_one_token_and_a_guess_past_the_samples_is_their_length():
    with pytest.raises(ConfigError, match="compile_ahead_tokens"):
        TrainerConfig(max_seq_len=32, compile_ahead_tokens=(16,))
    with pytest.raises(ConfigError, match="compile_ahead_tokens"):
        TrainerConfig(max_seq_len=32, row_tokens=32, compile_ahead_tokens=(16, 0))
    # A run that shortens a recipe's samples keeps its guesses: none can be longer than a sample.
    assert TrainerConfig(max_seq_len=32, row_tokens=32, compile_ahead_tokens=(64, 16)).compile_ahead_means == (32, 16)


def test_the_quickstarts_guesses_are_distinct_buckets_on_the_trainers_one_device():
    """Each of the quickstart's guesses compiles a bucket of its own where its trainer runs (one CPU
    device): a guess whose shape another already has compiles nothing (96 was the 64-row bucket of 128)."""
    import jax

    from pipelines.config import load_run_config
    from rlax_core.models.config import toy_config
    from rlax_core.parallel import make_mesh
    from rlax_core.training.step import Trainer

    config = load_run_config(Path(__file__).parents[2] / "configs" / "quickstart.yaml")
    one_device = Trainer(toy_config(), config.algorithm, config.trainer, make_mesh(config.trainer.mesh, jax.devices()[:1]))
    shapes = [batch_shape(one_device.batches.abstract(config.rows_per_step(), tokens))
              for tokens in config.trainer.compile_ahead_means]
    assert len(set(shapes)) == len(shapes) == 2
    assert sorted(rows for (rows, _), _ in shapes) == [46, 64]  # the rows most of the quickstart's steps fill
