"""What makes a checkpoint trustworthy: a seal written last, checked before anything of it is used.

A checkpoint folder ``N/`` is trusted once it holds ``rlax_seal.json``, written after orbax has
committed the rest, holding:

* a 64-bit digest of every array of the train state, by its path in the tree (``params/layers/...``);
* the SHA-256 of the data ledger, as JSON;
* every file of the folder with its size, and the SHA-256 of each file up to ``SMALL_FILE_BYTES``
  (metadata, index nodes, the ledger, small arrays); bigger files hold array data, which the array
  digests check through the values they decode to (a flipped bit there that no restore reads, in
  an index node orbax superseded, goes unseen: it cannot change what a restore returns);
* the SHA-256 of all of the above, so that a change in the seal itself is seen too.

Restoring checks them in that order: files (sizes, digests), then the arrays as restored, then the
ledger. A bit flipped anywhere, a truncated or missing file makes the restore raise
:class:`CheckpointCorrupt` naming the file or array, before the trainer uses any of it (a file added
since is named in a warning: nothing the seal covers refers to it, so no restore reads it).

Array digests are computed on the devices that hold the arrays, each device over its own shards,
and summed: each 32-bit word is mixed with its position in the whole array (MurmurHash3's
finaliser), and an array's digest is two sums modulo 2**32 of those, plain and weighted by an odd
function of the position. A sum does not depend on how the array is cut, so the digest of a
checkpoint saved on 64 chips checks its restore on 8, or on one host to inspect it; the mixing is a
bijection of the word, so changing any one word always changes the digest. At save the digests are queued on the devices before orbax
copies the state out (they cost one read of the state in device memory, no host copy) and the
background thread that seals the checkpoint fetches them; at restore they are computed on the
restored arrays.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from rlax_core.models.checkpoint import CheckpointError
from rlax_core.utils.storage import Storage

log = logging.getLogger(__name__)
SEAL_NAME = "rlax_seal.json"
SEAL_FORMAT = 1
# Files up to this size are digested whole: every file of a small checkpoint, and of a large one its
# metadata, index nodes, ledger and small arrays. Bigger files are orbax's array data (up to 2 GiB
# each), checked through the values they decode to: reading them back would cost a full read of the
# checkpoint on the host that seals it.
SMALL_FILE_BYTES = 16 << 20

# The word's multiplier is odd, so the mixing stays a bijection of the word at each position.
_WORD, _POSITION, _SEED = 0x9E3779B1, 0x85EBCA77, 0x27D4EB2F
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


class CheckpointCorrupt(CheckpointError):
    """A checkpoint that cannot be trusted: a file or an array differs from its seal, or it has no seal."""


class CheckpointUnsealed(CheckpointCorrupt):
    """A checkpoint whose save did not finish: orbax committed it, the process died before the seal."""


def leaf_name(path: tuple) -> str:
    """``params/layers/attn/q_proj/kernel``: the same for a TrainState and for the plain tree a restore
    without a target gives."""
    return "/".join(str(getattr(key, "name", getattr(key, "key", getattr(key, "idx", key)))) for key in path)


def named_leaves(tree: Any) -> list[tuple[str, Any]]:
    return [(leaf_name(path), leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)]


def _fmix32(h: jax.Array) -> jax.Array:
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def _words(x: jax.Array) -> jax.Array:
    """The array's bits as uint32 words (a 64-bit element is two words: a trailing axis of 2)."""
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = x.dtype.itemsize
    if size == 8:
        return lax.bitcast_convert_type(x, jnp.uint32)
    if size not in _UNSIGNED:
        raise TypeError(f"cannot digest an array of {x.dtype}")
    return lax.bitcast_convert_type(x, _UNSIGNED[size]).astype(jnp.uint32)


def _positions(shape: tuple[int, ...]) -> jax.Array:
    """Each element's row-major position in the whole array (modulo 2**32)."""
    position, stride = jnp.zeros(shape, jnp.uint32), 1
    for axis in reversed(range(len(shape))):
        position = position + lax.broadcasted_iota(jnp.uint32, shape, axis) * jnp.uint32(stride % (1 << 32))
        stride *= shape[axis]
    return position


def _digest(x: jax.Array) -> jax.Array:
    words = _words(x)
    position = _positions(words.shape)
    mixed = _fmix32(words * jnp.uint32(_WORD) + position * jnp.uint32(_POSITION) + jnp.uint32(_SEED))
    # Lane 2 weighs each word's hash by an odd number, 2 * position + 1: a change of one word changes
    # both lanes; two changes cancel in both only if their differences also cancel weighted by position.
    return jnp.stack([jnp.sum(mixed, dtype=jnp.uint32),
                      jnp.sum(mixed * (position * jnp.uint32(2) + jnp.uint32(1)), dtype=jnp.uint32)])


@jax.jit
def _digests(leaves: list[jax.Array]) -> jax.Array:
    return jnp.stack([_digest(x) for x in leaves]) if leaves else jnp.zeros((0, 2), jnp.uint32)


def start_array_digests(tree: Any) -> tuple[list[str], jax.Array]:
    """Leaf names and their digests, ``[leaves, 2]`` uint32, queued on the devices (not waited for)."""
    named = named_leaves(tree)
    return [name for name, _ in named], _digests([jnp.asarray(leaf) for _, leaf in named])


def digest_strings(digests: jax.Array) -> list[str]:
    """The digests as 16 hex digits each; waits for them. They are sums over all shards, replicated on
    every device: any process reads its own copy, with no collective (the seal's background thread
    runs on the chief alone)."""
    local = digests.addressable_shards[0].data if digests.is_fully_replicated else digests
    return [f"{int(a):08x}{int(b):08x}" for a, b in np.asarray(jax.device_get(local))]


def ledger_digest(ledger_json: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(ledger_json, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclasses.dataclass(frozen=True)
class Seal:
    step: int
    arrays: dict[str, dict[str, Any]]  # name -> {shape, dtype, digest}
    ledger: str  # SHA-256 of the ledger JSON
    files: dict[str, dict[str, Any]]  # relative path -> {bytes[, sha256]}

    def body(self) -> dict[str, Any]:
        return {"format": SEAL_FORMAT, "step": self.step, "small_file_bytes": SMALL_FILE_BYTES,
                "arrays": self.arrays, "ledger": self.ledger, "files": self.files}

    def to_bytes(self) -> bytes:
        body = self.body()
        return json.dumps({**body, "sha256": _canonical_digest(body)}, indent=1, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> "Seal":
        try:
            record = json.loads(data)
            claimed = record.pop("sha256")
            if claimed != _canonical_digest(record):
                raise ValueError("its own digest does not match")
            if record["format"] != SEAL_FORMAT:
                raise ValueError(f"format {record['format']}, this rlax reads {SEAL_FORMAT}")
            return cls(int(record["step"]), record["arrays"], record["ledger"], record["files"])
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise CheckpointCorrupt(f"{where}: the seal is damaged ({error})") from None


def _canonical_digest(body: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def inventory(storage: Storage, folder: str) -> dict[str, dict[str, Any]]:
    """Every file under ``folder`` (but the seal): its size, and the SHA-256 of the small ones."""
    sizes = {path: size for path, size in storage.files(folder).items() if path != SEAL_NAME}
    small = sorted(path for path, size in sizes.items() if size <= SMALL_FILE_BYTES)
    with ThreadPoolExecutor(8) as pool:  # gs://: one round trip per file, in parallel
        digests = dict(zip(small, pool.map(lambda p: hashlib.sha256(storage.read(f"{folder}/{p}")).hexdigest(), small)))
    return {path: {"bytes": size, **({"sha256": digests[path]} if path in digests else {})}
            for path, size in sorted(sizes.items())}


def check_files(seal: Seal, storage: Storage, folder: str, where: str) -> None:
    """Raise CheckpointCorrupt for a file missing, added, resized or changed since the seal was written."""
    found = inventory(storage, folder)
    for path in sorted(set(seal.files) | set(found)):
        sealed, now = seal.files.get(path), found.get(path)
        if sealed is None:  # no restore reads a file no sealed file refers to (a .DS_Store, an editor's swap)
            log.warning("%s: %s was not there when the checkpoint was sealed; it is not read", where, path)
            continue
        if now is None:
            raise CheckpointCorrupt(f"{where}: {path} is missing")
        if now["bytes"] != sealed["bytes"]:
            raise CheckpointCorrupt(f"{where}: {path} holds {now['bytes']:,} bytes, {sealed['bytes']:,} when sealed")
        if now.get("sha256") != sealed.get("sha256"):
            raise CheckpointCorrupt(f"{where}: {path} differs from its SHA-256 in the seal")


def check_arrays(seal: Seal, tree: Any, where: str) -> None:
    """Raise CheckpointCorrupt for a restored array whose digest differs from the seal's (names them)."""
    names, digests = start_array_digests(tree)
    found = dict(zip(names, digest_strings(digests)))
    if set(found) != set(seal.arrays):
        missing, extra = sorted(set(seal.arrays) - set(found)), sorted(set(found) - set(seal.arrays))
        raise CheckpointCorrupt(f"{where}: the restored state's arrays differ from the sealed ones "
                                f"(missing {missing[:3]}, extra {extra[:3]})")
    wrong = [name for name in names if found[name] != seal.arrays[name]["digest"]]
    if wrong:
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise CheckpointCorrupt(f"{where}: array {', '.join(wrong[:3])}{more} differs from its digest in the seal "
                                "(its data changed after it was written)")
