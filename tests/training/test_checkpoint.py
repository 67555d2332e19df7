import jax
import jax.numpy as jnp
import numpy as np

from rlax_core.data.rollout_store import GroupKey
from rlax_core.training.checkpoint import Checkpointer, abstract_like
from rlax_core.training.ledger import DataLedger


def test_state_and_ledger_round_trip_and_keep_n(tmp_path):
    checkpointer = Checkpointer(tmp_path / "ckpt", keep=2, async_save=True)
    assert checkpointer.latest_step() is None
    state = {"params": {"w": jnp.arange(6.0).reshape(2, 3)}, "step": jnp.int32(0),
             "rng": jax.random.key_data(jax.random.key(3))}
    for step in (1, 2, 3):
        state = {**state, "params": {"w": state["params"]["w"] + 1}, "step": jnp.int32(step)}
        checkpointer.save(step, state, DataLedger(consumed=[GroupKey(s, 0) for s in range(step)],
                                                  dropped=[GroupKey(0, 9)]))
    checkpointer.wait()
    assert checkpointer.latest_step() == 3
    assert sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == [2, 3]
    restored, ledger = Checkpointer(tmp_path / "ckpt").restore(3, abstract_like(state))
    np.testing.assert_array_equal(restored["params"]["w"], state["params"]["w"])
    assert int(restored["step"]) == 3 and restored["rng"].dtype == jnp.uint32
    assert ledger.consumed == [GroupKey(0, 0), GroupKey(1, 0), GroupKey(2, 0)]
    assert ledger.dropped == [GroupKey(0, 9)]
    assert ledger.pending([GroupKey(3, 0), GroupKey(0, 9), GroupKey(2, 1)]) == [GroupKey(2, 1), GroupKey(3, 0)]
    checkpointer.close()
