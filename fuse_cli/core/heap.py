"""Handing freed memory back to the system.

glibc serves allocations below its mmap threshold from its heap, and raises that threshold (up to
32 MB) each time a larger block is freed; freed heap blocks then stay resident until something
trims the heap. A verification run of BERT-base's original (its Transpose(W) outputs, 2-9 MB
each) left 250 MB resident that way after its session was gone, and a pipeline that rewrites
every weight leaves the size of the weights. `trim` returns the free pages, at the points where
fuse has just let go of a lot: after an onnxruntime session, after a pipeline run.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None


def trim() -> None:
    malloc_trim = _malloc_trim()
    if malloc_trim is not None:
        malloc_trim(0)
