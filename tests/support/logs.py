"""toolpair's own log lines, caught for a test that asserts on what they say (or must not say)."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager

from proxy.ops.logs import log_handler

__all__ = ["captured_logs"]


@contextmanager
def captured_logs(log_format: str, level: int) -> Iterator[io.StringIO]:
    """toolpair's handler for ``log_format`` on the root logger at ``level``, writing into the yielded stream; the
    root logger as it was afterwards."""
    stream = io.StringIO()
    handler = log_handler(log_format, stream)
    root = logging.getLogger()
    before = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(before)
