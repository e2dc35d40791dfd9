"""The garbage-collector policy of a long-running server.

Python's cyclic GC walks every tracked object; with a large registry and
thousands of streams its full collections pause the process for tens of
milliseconds (PERF-NOTES: 50-70 ms), which becomes the commit path's tail
latency. After startup the long-lived objects (rows, loaded sessions) are
frozen out of the collector's view, and the young-generation threshold is
raised so that collections are rarer. Reference counting still frees almost
everything at once; only cycles wait longer.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

# gen0 allocations between collections (CPython's default is 700).
GEN0_THRESHOLD: Final = 50_000


def tune_gc() -> None:
    """Call once the store has recovered: freeze what exists, collect less
    often, and give back what the start's decoding left free (trim_heap)."""
    gc.collect()
    gc.freeze()
    _, g1, g2 = gc.get_threshold()
    gc.set_threshold(GEN0_THRESHOLD, g1, g2)
    trim_heap()


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's
    `malloc_trim`): a start decodes the checkpoint and the logs' tails, and
    what it freed stays with the heap between the rows that live on (~7 MB
    of a 100,000-session start's RSS, issue 29). A no-op without glibc."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


@contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic collections while the block runs (a start's replay: a
    million records decoded make thousands of young-generation collections
    that find nothing to free; issue 29 measured them at a sixth of the
    replay). Reference counting still frees everything as it goes."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
