"""Pausing CPython's cyclic garbage collector around bulk allocation.

Reading a trace, building its workload and the replay's per-workload data allocate
millions of short-lived containers and no reference cycles. The cyclic collector would
only rescan the live heap, and more often the larger the trace: 10-25% of a parse, and a
share of building that grows faster than the trace (``bench/trace_scaling.py``).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """The cyclic collector off inside the block (as it was outside); reference counting still frees."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
