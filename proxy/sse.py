"""Server-sent events: framing, decoding and encoding, as small sync transducers.

Follows https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation
literally: lines end in CRLF, LF or CR; a line starting with ``:`` is a
comment; one leading space after the colon is dropped; several ``data`` lines
join with ``\\n``; a blank line dispatches the event. Bytes are kept until a
whole line is there, and decoded as UTF-8 only then, so a chunk may split a
line, a CRLF or a multi-byte character anywhere.

Each transducer has ``feed(chunk) -> list`` and ``finish() -> list``; feeding
any split of the input gives the same output as feeding it whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from proxy.errors import UpstreamError

MAX_EVENT_BYTES = 16 * 1024 * 1024
"""The largest SSE frame, line or event accepted from an upstream. An engine
that streams one endless event would otherwise be buffered without limit."""


class EventTooLargeError(UpstreamError):
    """Raised when an upstream's SSE frame, line or event grows past :data:`MAX_EVENT_BYTES`."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"upstream sent a server-sent event larger than {limit} bytes")


__all__ = [
    "MAX_EVENT_BYTES",
    "EventDecoder",
    "EventTooLargeError",
    "FrameSplitter",
    "LineDecoder",
    "ServerSentEvent",
    "encode_event",
]

# Two line endings in a row end a frame. A lone CR only counts when we know
# what follows it, so a trailing CR is never examined (see FrameSplitter.feed).
_FRAME_END = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r(?!\n)|\n)")


class FrameSplitter:
    """Cut a byte stream into whole SSE frames, blank line included.

    Used to relay a stream without decoding it, while never writing half a
    frame: on an upstream failure, the pending partial frame is simply dropped.

    >>> s = FrameSplitter(); s.feed(b"data: a\\n\\ndata: b"), s.feed(b"\\n\\n")
    ([b'data: a\\n\\n'], [b'data: b\\n\\n'])
    """

    __slots__ = ("_buffer", "_scanned")

    def __init__(self) -> None:
        self._buffer = b""
        self._scanned = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk if self._buffer else chunk
        limit = len(buffer) - 1 if buffer.endswith(b"\r") else len(buffer)
        frames: list[bytes] = []
        start = 0
        position = max(0, self._scanned - 3)
        if b"\r" in buffer:
            while True:
                match = _FRAME_END.search(buffer, position, limit)
                if match is None:
                    break
                frames.append(buffer[start : match.end()])
                start = position = match.end()
        else:
            # Without a CR the pattern can only match LF LF, and bytes.find finds the same
            # leftmost match about twenty times faster than the regex (most engines send LF only).
            while (end := buffer.find(b"\n\n", position, limit)) >= 0:
                frames.append(buffer[start : end + 2])
                start = position = end + 2
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise EventTooLargeError(MAX_EVENT_BYTES)
        self._scanned = limit - start
        return frames

    def feed_whole(self, chunk: bytes) -> bytes:
        """Like :meth:`feed`, with the whole frames as one piece of bytes: what a relay writes.

        Cuts where :meth:`feed` cuts and leaves the same state, but an LF-only stream costs one
        ``rfind`` per chunk instead of a slice per frame.

        >>> s = FrameSplitter(); s.feed_whole(b"data: a\\n\\ndata: b\\n\\ndata: c"), s.pending
        (b'data: a\\n\\ndata: b\\n\\n', b'data: c')
        """
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\r" in buffer:
            return b"".join(self.feed(chunk))
        if buffer.endswith(b"\n\n") and (len(buffer) == 2 or buffer[-3] != 0x0A):
            # The usual chunk, ending with a frame: an LF pair after a non-LF is always a cut.
            self._buffer = b""
            self._scanned = 0
            return buffer
        last = buffer.rfind(b"\n\n", max(0, self._scanned - 3))
        end = 0
        if last >= 0:
            # feed matches LF LF pairs left to right without overlap, so within a run of LFs its
            # last cut falls after an even number of them, counted from the run's first LF.
            run = last
            while run > 0 and buffer[run - 1] == 0x0A:
                run -= 1
            end = run + (last + 2 - run) // 2 * 2
        self._buffer = buffer[end:]
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise EventTooLargeError(MAX_EVENT_BYTES)
        self._scanned = len(buffer) - end
        return buffer[:end]

    @property
    def pending(self) -> bytes:
        """Bytes of a frame that has not ended yet."""
        return self._buffer

    def finish(self) -> list[bytes]:
        """End of input: a trailing partial frame is not a frame, so nothing more comes out."""
        self._buffer = b""
        self._scanned = 0
        return []


_LINE_END = re.compile(rb"\r\n|\r|\n")


class LineDecoder:
    """Bytes to text lines, splitting on CRLF, LF or CR across chunk boundaries."""

    __slots__ = ("_buffer", "_skip_lf")

    def __init__(self) -> None:
        self._buffer = b""
        self._skip_lf = False

    def feed(self, chunk: bytes) -> list[str]:
        if not chunk:
            return []
        if self._skip_lf:
            # The previous chunk ended in CR: an LF here belongs to that line end.
            self._skip_lf = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        buffer = self._buffer + chunk if self._buffer else chunk
        lines: list[str] = []
        start = 0
        for match in _LINE_END.finditer(buffer):
            lines.append(buffer[start : match.start()].decode("utf-8", "replace"))
            start = match.end()
        if start and buffer[start - 1 : start] == b"\r" and start == len(buffer):
            self._skip_lf = True
        self._buffer = buffer[start:]
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise EventTooLargeError(MAX_EVENT_BYTES)
        return lines

    @property
    def pending(self) -> bool:
        """True when the input so far ends inside a line."""
        return bool(self._buffer)

    def finish(self) -> list[str]:
        if not self._buffer:
            return []
        line = self._buffer.decode("utf-8", "replace")
        self._buffer = b""
        return [line]


@dataclass(frozen=True)
class ServerSentEvent:
    """One dispatched event. ``event`` is ``"message"`` when the stream named none."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class EventDecoder:
    """Bytes to :class:`ServerSentEvent`, per the spec's interpretation rules.

    >>> d = EventDecoder(); d.feed(b"event: ping\\ndata: {}\\n"), d.feed(b"\\n")
    ([], [ServerSentEvent(data='{}', event='ping', id=None, retry=None)])
    """

    __slots__ = ("_data", "_event", "_id", "_lines", "_retry", "_size")

    def __init__(self) -> None:
        self._lines = LineDecoder()
        self._size = 0
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        return self._take(self._lines.feed(chunk))

    @property
    def pending(self) -> bool:
        """True when the input so far ends inside an event: one that has begun but has not been dispatched.

        >>> d = EventDecoder(); d.feed(b"data: {}\\n\\ndata: {"), d.pending
        ([ServerSentEvent(data='{}', event='message', id=None, retry=None)], True)
        """
        return bool(self._data or self._event or self._lines.pending)

    def finish(self) -> list[ServerSentEvent]:
        # A final event without its blank line is incomplete and is discarded (spec).
        self._take(self._lines.finish())
        self._data, self._event, self._size = [], "", 0
        return []

    def _take(self, lines: list[str]) -> list[ServerSentEvent]:
        events: list[ServerSentEvent] = []
        for line in lines:
            if not line:
                if self._data:
                    events.append(
                        ServerSentEvent("\n".join(self._data), self._event or "message", self._id, self._retry)
                    )
                self._data, self._event, self._size = [], "", 0
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "data":
                self._size += len(value) + 1
                if self._size > MAX_EVENT_BYTES:
                    raise EventTooLargeError(MAX_EVENT_BYTES)
                self._data.append(value)
            elif name == "event":
                self._event = value
            elif name == "id" and "\0" not in value:
                self._id = value
            elif name == "retry" and value.isdigit():
                self._retry = int(value)
        return events


def encode_event(data: str | bytes, event: str | None = None) -> bytes:
    """One SSE frame. Multi-line data becomes several ``data:`` lines.

    >>> encode_event('{"a":1}', "message_start")
    b'event: message_start\\ndata: {"a":1}\\n\\n'
    """
    raw = data.encode() if isinstance(data, str) else data
    head = b"event: " + event.encode() + b"\n" if event else b""
    if b"\n" not in raw and b"\r" not in raw:
        return head + b"data: " + raw + b"\n\n"
    lines = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    return head + b"".join(b"data: " + line + b"\n" for line in lines) + b"\n"
