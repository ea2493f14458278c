"""Keeps glibc's malloc from returning a compiled step's buffers to the kernel after every call.

XLA's CPU runtime allocates a compiled program's temporaries with ``malloc``
at each call and frees them when the call ends. glibc's malloc gives the
free memory at the top of a heap back to the kernel once it exceeds a trim
threshold, and serves requests at or above an mmap threshold with fresh
mappings, unmapped again on ``free``. Both thresholds start at 128 KiB and
adapt: when a mapped block is freed, glibc raises the mmap threshold to that
block's size (at most 32 MiB on 64-bit systems) and the trim threshold to
twice that. A process whose largest freed block so far was small keeps low
thresholds, and a step whose temporaries outgrow them is trimmed after every
call and faults its memory back in, page by page, on the next. Measured
(one core, jaxort.api on ORT's artifacts, processes alternated): ResNet-18
at widths 3-24 took 57-307 minor page faults and 1.08-1.30 ms a step in the
processes that hit it, 0 and 0.99-1.03 ms in those that did not; the same
program, which of the two a run got depended on what the process had
allocated and freed before (docs/benchmarks.md, "Page faults from the C
allocator").

:func:`settle_allocator` allocates and frees one block just under 32 MiB,
once per process, before the first compiled step: glibc then moves both
thresholds to where it moves them by itself in any process that has freed
a 32 MiB array (mmap 32 MiB, trim 64 MiB). It sets no allocator parameter,
so glibc keeps adapting; where the user has set one (``MALLOC_TRIM_THRESHOLD_``,
``MALLOC_MMAP_THRESHOLD_``, ``GLIBC_TUNABLES``, ``mallopt``) glibc no longer
adapts and this changes nothing. The block is never touched, so it costs no
resident memory. With other allocators (jemalloc, tcmalloc, macOS, Windows)
it is one allocation and one free.
"""

from __future__ import annotations

import ctypes
import functools
import sys

__all__ = ["settle_allocator"]

# Just under glibc's largest self-adjusted mmap threshold on 64-bit systems
# (DEFAULT_MMAP_THRESHOLD_MAX, 32 MiB): a mapped block of at most that size
# raises the thresholds when freed, a larger one does not.
_BLOCK_BYTES = (32 << 20) - (64 << 10)


@functools.cache
def settle_allocator() -> bool:
    """Allocates and frees one ``_BLOCK_BYTES`` block with the C allocator, once per process.

    Returns:
      Whether the block was allocated and freed (False off Linux, or where
      the C library's ``malloc`` cannot be reached).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        malloc, free = libc.malloc, libc.free
    except (OSError, AttributeError):
        return False
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t]
    free.restype = None
    free.argtypes = [ctypes.c_void_p]
    block = malloc(_BLOCK_BYTES)
    if not block:
        return False
    free(block)
    return True
