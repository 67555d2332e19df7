"""The delta codec: a shard of version v+1 as the XOR of its bytes with the same slice of version v,
split into byte planes and compressed with zstd.

XOR is exact and its own inverse, so a reader holding v gets v+1 back bit for bit. An optimizer step
with a small learning rate leaves the sign, the exponent and the top of the mantissa of most weights
as they were, so the XOR is zero in the high bytes; laying every chunk out as byte planes (all lowest
bytes, then all second bytes, ...) turns those zeros into long runs. Measured on AdamW-like float32
steps (lr 1e-6): 0.43 of the raw size with planes against 0.56 without, and 3.6x faster to compress;
on bfloat16, where a step changes ~3% of the values, 0.03. zstd level 1: level 3 compressed no better
and half as fast.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import zstandard

CODEC = "xor-byteplanes-zstd"
ZSTD_LEVEL = 1
# Elements per chunk: the XOR, the byte planes and zstd's window stay in the CPU cache.
CHUNK_ELEMENTS = 1 << 18

_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def chunk_bounds(size: int, chunk: int = CHUNK_ELEMENTS):
    """``(start, stop)`` of consecutive chunks covering ``range(size)``."""
    for start in range(0, size, chunk):
        yield start, min(start + chunk, size)


def _words(array: np.ndarray, itemsize: int | None = None) -> np.ndarray:
    """The same bytes as unsigned integers of the element's width (uint8 for other widths)."""
    return array.view(_WORDS.get(itemsize or array.dtype.itemsize, np.uint8))


class DeltaEncoder:
    """Feed ``add(new_chunk, base_chunk)`` for consecutive chunks of a shard, then ``finish()``.

    The encoded bytes go to ``sink.write`` as they are produced; ``finish`` returns their size and
    checksum, the delta's own record.
    """

    def __init__(self, sink, dtype: np.dtype, total_elements: int, checksum_update: Callable[[bytes], None]):
        self._sink = sink
        self._itemsize = np.dtype(dtype).itemsize
        self._update = checksum_update
        self._compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj(size=total_elements * self._itemsize)
        chunk = min(CHUNK_ELEMENTS, max(total_elements, 1))
        self._xor = np.empty(chunk * self._itemsize, np.uint8)
        self._planes = np.empty(chunk * self._itemsize, np.uint8)
        self.nbytes = 0

    def add(self, new: np.ndarray, base: np.ndarray) -> None:
        count = new.size
        xor = _words(self._xor[:count * self._itemsize], self._itemsize)
        np.bitwise_xor(_words(new), _words(base), out=xor)
        planes = self._planes[:count * self._itemsize].reshape(self._itemsize, count)
        xor_bytes = xor.view(np.uint8)
        for plane in range(self._itemsize):  # one strided copy per plane: 7x faster than a 2-D transpose
            planes[plane] = xor_bytes[plane::self._itemsize]
        self._emit(self._compressor.compress(planes))

    def finish(self) -> int:
        self._emit(self._compressor.flush())
        return self.nbytes

    def _emit(self, data: bytes) -> None:
        if data:
            self._update(data)
            self._sink.write(data)
            self.nbytes += len(data)


def decode_delta(payload: bytes, base: np.ndarray, out: np.ndarray, on_chunk: Callable[[np.ndarray], None]) -> None:
    """``out = base XOR delta`` for flat arrays of one dtype; ``on_chunk`` sees each finished chunk.

    Raises ``ValueError`` when the payload does not decode to exactly ``out.nbytes`` bytes.
    """
    itemsize = out.dtype.itemsize
    planes = np.empty(min(CHUNK_ELEMENTS, max(out.size, 1)) * itemsize, np.uint8)
    words = np.empty_like(planes)
    try:
        with zstandard.ZstdDecompressor().stream_reader(payload) as reader:
            for start, stop in chunk_bounds(out.size):
                count = stop - start
                chunk_planes = planes[:count * itemsize]
                _read_exactly(reader, chunk_planes)
                chunk_words = words[:count * itemsize]
                for plane in range(itemsize):
                    chunk_words[plane::itemsize] = chunk_planes[plane * count:(plane + 1) * count]
                target = out[start:stop]
                np.bitwise_xor(_words(base[start:stop]), _words(chunk_words, itemsize), out=_words(target))
                on_chunk(target)
            if reader.read(1):
                raise ValueError("the delta decodes to more bytes than the shard holds")
    except zstandard.ZstdError as error:
        raise ValueError(f"the delta does not decode ({error})") from None


def _read_exactly(reader, buffer: np.ndarray) -> None:
    view, filled = memoryview(buffer), 0
    while filled < len(view):
        got = reader.readinto(view[filled:])
        if not got:
            raise ValueError("the delta decodes to fewer bytes than the shard holds")
        filled += got
