"""A one-line progress display for long file jobs, drawn on stderr only when it is a terminal."""

from __future__ import annotations

import time
from typing import TextIO

__all__ = ["Progress", "format_progress"]


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_progress(lines: int, done_bytes: int, elapsed: float, fraction: float | None) -> str:
    """Lines, megabytes, speed, and when the total is known, percent and time left.

    >>> format_progress(12345, 50_000_000, 0.5, 0.25)
    '12,345 lines  50.0 MB  100.0 MB/s  25%  ETA 0:02'
    >>> format_progress(7, 1_000_000, 2.0, None)
    '7 lines  1.0 MB  0.5 MB/s'
    """
    rate = done_bytes / 1e6 / elapsed if elapsed > 0 else 0.0
    text = f"{lines:,} lines  {done_bytes / 1e6:.1f} MB  {rate:.1f} MB/s"
    if fraction is not None:
        fraction = min(max(fraction, 0.0), 1.0)
        left = elapsed * (1 - fraction) / fraction if fraction > 0 else 0.0
        text += f"  {fraction:.0%}  ETA {_clock(left)}"
    return text


class Progress:
    """Redraws at most ``interval`` times a second; ``done()`` draws the last state and ends the line."""

    def __init__(self, stream: TextIO, *, interval: float = 0.2) -> None:
        self._stream = stream
        self._interval = interval
        self._start = time.monotonic()
        self._next = self._start
        self._last = ""

    def update(self, lines: int, done_bytes: int, fraction: float | None, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self._interval
        self._last = format_progress(lines, done_bytes, now - self._start, fraction)
        self._stream.write(f"\r{self._last}\x1b[K")
        self._stream.flush()

    def done(self, lines: int, done_bytes: int, fraction: float | None) -> None:
        self.update(lines, done_bytes, fraction, force=True)
        self._stream.write("\n")
        self._stream.flush()
