"""The data ledger: which rollout groups the trainer has consumed, and which it dropped as stale.

It is saved inside every checkpoint, atomically with the parameters, so that after a restart the
trainer neither trains a group twice nor skips one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from rlax_core.data.rollout_store import GroupKey


@dataclass
class DataLedger:
    consumed: list[GroupKey] = field(default_factory=list)  # in the order they were trained on
    dropped: list[GroupKey] = field(default_factory=list)  # too stale to train on (staleness bound)

    def seen(self) -> set[GroupKey]:
        return set(self.consumed) | set(self.dropped)

    def pending(self, available: Iterable[GroupKey]) -> list[GroupKey]:
        """The groups of ``available`` not yet consumed or dropped, in schedule order."""
        seen = self.seen()
        return sorted(key for key in available if key not in seen)

    def to_json(self) -> dict[str, Any]:
        return {"consumed": [[k.step, k.prompt_index] for k in self.consumed],
                "dropped": [[k.step, k.prompt_index] for k in self.dropped]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DataLedger":
        return cls(consumed=[GroupKey(*pair) for pair in data["consumed"]],
                   dropped=[GroupKey(*pair) for pair in data["dropped"]])
