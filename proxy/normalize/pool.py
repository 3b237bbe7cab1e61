"""The worker processes of ``toolpair normalize --workers N``, shared by the JSONL and Parquet paths.

Workers are forked when the process runs no other thread: they start at once,
with every module already loaded, which matters when a whole run takes a second.
Beside another thread they are spawned instead (a fresh interpreter each), since
a fork would copy locks that thread may hold. Either way a worker runs with the
garbage collector off: parsed records hold no cycles, so it would only walk them.
A pool forks all its workers at its first task, before anything is written, so no
worker inherits an output buffer with data in it.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from proxy.normalize.files import NormalizeFailed

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing.context import BaseContext

__all__ = ["pool_context", "worker_pool"]


def pool_context() -> BaseContext:
    """Fork when this process runs no other thread, else spawn (see the module docstring)."""
    import multiprocessing  # here, not at the top: a one-process run starts faster without it

    return multiprocessing.get_context("fork" if threading.active_count() == 1 else "spawn")


def _quiet_worker() -> None:
    gc.disable()


@contextmanager
def worker_pool(workers: int) -> Iterator[ProcessPoolExecutor]:
    """A pool of ``workers`` processes for the block; it waits for them at the end.

    A worker that dies (killed, out of memory) breaks the pool: that is NormalizeFailed here,
    the one place it is said, for JSONL and Parquet alike.
    """
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    try:
        with ProcessPoolExecutor(workers, mp_context=pool_context(), initializer=_quiet_worker) as pool:
            yield pool
    except BrokenProcessPool:
        raise NormalizeFailed("a worker process died; try fewer --workers") from None
