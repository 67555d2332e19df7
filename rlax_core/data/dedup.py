"""Model-free text fingerprints for deduplication and decontamination (no Beam, no model).

* exact / surface duplicates: the SHA-256 of :func:`rlax_core.data.records.normalize_text`
  (NFKC, case, white space), so "What is 2+2?" and "what  is 2+2 ?" collide only if they
  normalise alike, and so do full-width digits and their ASCII forms.
* near duplicates: MinHash signatures (datasketch) over word shingles, bucketed by LSH bands; two
  rows in one bucket are near duplicates when their estimated Jaccard similarity reaches the threshold.
* contamination: word n-grams (13 by default) shared with an evaluation set.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

import numpy as np
from datasketch import MinHash, MinHashLSH

from rlax_core.data.records import normalize_text

_WORD = re.compile(r"\w+", re.UNICODE)


def words(text: str) -> list[str]:
    """Word tokens of the normalised text; punctuation and LaTeX markup are separators."""
    return _WORD.findall(normalize_text(text))


def exact_key(text: str) -> str:
    """Key under which exact and surface duplicates collide."""
    return hashlib.sha256(normalize_text(text).encode("utf-8")).hexdigest()


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


def ngram_hashes(text: str, n: int) -> set[int]:
    """64-bit hashes of the word n-grams; a text shorter than n words is one gram of all its words."""
    tokens = words(text)
    if not tokens:
        return set()
    if len(tokens) < n:
        return {_hash64(" ".join(tokens))}
    return {_hash64(" ".join(tokens[i : i + n])) for i in range(len(tokens) - n + 1)}


def minhash_signature(text: str, *, num_perm: int, shingle_size: int, seed: int = 1) -> np.ndarray:
    """The MinHash signature (``num_perm`` uint64) of the text's word shingles."""
    tokens = words(text)
    shingles = {" ".join(tokens[i : i + shingle_size]) for i in range(max(1, len(tokens) - shingle_size + 1))}
    minhash = MinHash(num_perm=num_perm, seed=seed)
    minhash.update_batch([s.encode("utf-8") for s in shingles])
    return minhash.hashvalues.astype(np.uint64)


def estimated_jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard similarity estimated from two signatures of the same permutations."""
    if a.shape != b.shape:
        raise ValueError(f"signatures differ in length: {a.shape} vs {b.shape}")
    return float(np.mean(a == b))


@lru_cache(maxsize=None)
def lsh_params(threshold: float, num_perm: int) -> tuple[int, int]:
    """(bands, rows per band) that datasketch's LSH picks for this threshold and signature length.

    A threshold of 1 asks for identical signatures: one band holding the whole signature.
    """
    if threshold >= 1.0:
        return 1, num_perm
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    return lsh.b, lsh.r


def lsh_band_keys(signature: np.ndarray, bands: int, rows: int) -> list[str]:
    """One bucket key per band; rows sharing any key are near-duplicate candidates."""
    return [
        f"{band}:{hashlib.blake2b(signature[band * rows : (band + 1) * rows].tobytes(), digest_size=12).hexdigest()}"
        for band in range(bands)
    ]
