"""A multi-host publish: each host writes the shards it holds and its partial manifest, and host 0
merges them into the version's tensor records once every host's part is there.

    step_00000012/part-00001.json       host 1's records: its shards of each tensor

A merged tensor must be covered exactly by its shards (``arrays.check_coverage``); a host that does
not finish within ``commit_timeout_s`` fails the publish loudly, naming the parts still missing.
"""

from __future__ import annotations

import dataclasses
import json
import time

from rlax_core.utils.storage import Storage
from rlax_core.weights.arrays import check_coverage
from rlax_core.weights.manifest import ShardRecord, TensorRecord


def part_path(folder: str, process_index: int) -> str:
    return f"{folder}/part-{process_index:05d}.json"


def part_json(records: list[TensorRecord]) -> bytes:
    return json.dumps([dataclasses.asdict(r) for r in records]).encode()


def merge_parts(storage: Storage, folder: str, version: int, process_count: int, *, timeout_s: float,
                poll_interval_s: float) -> list[TensorRecord]:
    """Every host's records of ``version``, merged tensor by tensor in the order they first appear."""
    names = [part_path(folder, i) for i in range(process_count)]
    deadline = time.monotonic() + timeout_s
    while not all(storage.exists(n) for n in names):
        if time.monotonic() >= deadline:
            missing = [n for n in names if not storage.exists(n)]
            raise TimeoutError(f"version {version}: hosts did not finish writing within {timeout_s:.0f}s; "
                               f"missing {missing}")
        time.sleep(poll_interval_s)
    merged: dict[str, TensorRecord] = {}
    for name in names:
        for raw in json.loads(storage.read(name)):
            shards = tuple(ShardRecord.from_dict(shard) for shard in raw["shards"])
            previous = merged.get(raw["name"])
            merged[raw["name"]] = (TensorRecord(raw["name"], raw["dtype"], tuple(raw["shape"]), shards)
                                   if previous is None else dataclasses.replace(previous, shards=previous.shards + shards))
    for record in merged.values():
        check_coverage(record, where=f"version {version}")
    return list(merged.values())
