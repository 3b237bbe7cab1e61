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
from typing import TYPE_CHECKING

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


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes; use it as a context manager, which waits for them at the end."""
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(workers, mp_context=pool_context(), initializer=_quiet_worker)
