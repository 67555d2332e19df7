"""The host's side of the paged KV cache: which sequences hold which pages.

``PagePool`` is the one place pages change hands. A sequence takes pages when it is admitted
(``admit``), as its decoding crosses page boundaries (``grow``) and from a sibling whose prompt it
shares (``share``); it gives them back when it ends or is preempted (``release``). A page carries a
reference count: the samples of one prompt point at the same full prompt pages, and a page returns
to the free list when its last holder lets go, exactly once.

How much a sequence takes at admission is the admission rule (``EngineConfig.admission``):
``reserve`` takes its whole budget (``Request.budget``: prompt and completion, or an episode's
every turn), so a running sequence never runs out of cache but the pool holds mostly empty
reservations when samples stop early; ``on_demand`` takes what it holds now plus one decode call's
look-ahead and grows a page at a time, and the engine preempts when the pool runs out.

``PageAllocator`` is the free list under it. Page 0 (``kv_cache.SINK_PAGE``) is never handed out:
it is the sink for writes that must go nowhere (prompt padding, idle slots).
"""

from __future__ import annotations

import collections

from rlax_core.inference.kv_cache import SINK_PAGE
from rlax_core.inference.sequences import SequenceState


def pages_needed(num_tokens: int, page_size: int) -> int:
    return -(-num_tokens // page_size)


class PageAllocator:
    """Host-side free list of pages 1..num_pages-1 (page 0 is the sink)."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError("a paged cache needs the sink page plus at least one page")
        self.num_pages = num_pages
        # Hand out low page numbers first: a fresh engine then touches a compact prefix of the pool.
        self._free = list(range(num_pages - 1, SINK_PAGE, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, count: int) -> list[int] | None:
        """``count`` pages, or None (and nothing taken) when fewer are free."""
        if count > len(self._free):
            return None
        return [self._free.pop() for _ in range(count)]

    def free(self, pages: list[int]) -> None:
        if any(p == SINK_PAGE or not 0 < p < self.num_pages for p in pages):
            raise ValueError(f"cannot free pages {pages}: outside 1..{self.num_pages - 1}")
        self._free.extend(reversed(pages))
        if len(self._free) > self.num_pages - 1:
            raise RuntimeError("page freed twice: the free list holds more pages than the pool")


class PagePool:
    """The pages of one engine's KV pool, their reference counts and the sequences holding them.

    ``lookahead``: tokens an ``on_demand`` admission takes beyond what a sequence holds now (one
    decode call's), so that an admitted sequence decodes its first call without growing.
    """

    def __init__(self, num_pages: int, page_size: int, admission: str = "reserve", lookahead: int = 0):
        self.page_size, self.admission, self.lookahead = page_size, admission, lookahead
        self._free = PageAllocator(num_pages)
        self._references: collections.Counter[int] = collections.Counter()
        self.peak_in_use = 0

    @property
    def num_free(self) -> int:
        """Pages no sequence holds (the sink page aside)."""
        return self._free.num_free

    @property
    def in_use(self) -> int:
        """Pages some sequence holds (a shared page counts once)."""
        return len(self._references)

    def pages_for(self, num_tokens: int) -> int:
        return pages_needed(num_tokens, self.page_size)

    def references(self, page: int) -> int:
        """How many sequences hold ``page``."""
        return self._references[page]

    def admit(self, seq: SequenceState, tokens: int, running: int = 0) -> bool:
        """Give ``seq``, which holds ``tokens`` tokens once admitted, the pages its admission rule
        asks for: its whole budget (``reserve``), or ``tokens`` plus the look-ahead (``on_demand``),
        leaving a page free for each of the ``running`` sequences to grow by in their next decode
        call (admitting into the last free pages would preempt the newcomer at once). False, and
        nothing taken, when too few are free."""
        budget = seq.request.budget
        if self.admission == "reserve":
            return self.grow(seq, budget)
        wanted = min(tokens + self.lookahead, budget)
        if self.pages_for(wanted) - len(seq.pages) > self.num_free - running:
            return False
        return self.grow(seq, wanted)

    def grow(self, seq: SequenceState, tokens: int) -> bool:
        """Make ``seq`` hold pages for its first ``tokens`` tokens; False (nothing taken) if too few are free."""
        missing = self.pages_for(tokens) - len(seq.pages)
        if missing <= 0:
            return True
        pages = self._free.allocate(missing)
        if pages is None:
            return False
        self._references.update(pages)
        seq.pages.extend(pages)
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return True

    def share(self, owner: SequenceState, seq: SequenceState, count: int) -> None:
        """Let ``seq``, which holds no pages yet, point at ``owner``'s first ``count`` pages (full
        pages of a prompt they share: neither writes them again)."""
        if seq.pages:
            raise RuntimeError(f"sample {seq.sample_index} of {seq.request.prompt_id!r} already holds pages")
        if count > len(owner.pages):
            raise RuntimeError(f"cannot share {count} pages: the owner holds {len(owner.pages)}")
        seq.pages = owner.pages[:count]
        self._references.update(seq.pages)

    def release(self, seq: SequenceState) -> None:
        """Drop ``seq``'s hold on its pages; those nobody else holds go back to the free list."""
        last = []
        for page in seq.pages:
            self._references[page] -= 1
            if self._references[page] == 0:
                del self._references[page]
                last.append(page)
            elif self._references[page] < 0:
                raise RuntimeError(f"page {page} released more often than it was taken")
        self._free.free(last)
        seq.pages = []
