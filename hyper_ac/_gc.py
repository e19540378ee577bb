"""``paused_gc()``: the cyclic garbage collector off while a step builds a large graph or document.

Serialising, applying a plan and splitting a 50k-node graph allocate hundreds of
thousands of objects; each allocation burst lets the collector start a full
(oldest-generation) pass over the whole heap, seconds each on a large graph, and
these steps make no garbage cycles worth collecting. The previous state is
restored on exit, also on an exception; nesting is fine.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

__all__ = ["paused_gc"]


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
