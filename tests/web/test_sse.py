"""SSE transducers: splitting the input anywhere gives the same output."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.sse import (
    MAX_EVENT_BYTES,
    EventDecoder,
    EventTooLargeError,
    FrameSplitter,
    LineDecoder,
    ServerSentEvent,
    encode_event,
)

STREAM = (
    b": comment\r\n"
    b'event: message_start\r\ndata: {"a": "\xc3\xa9t\xc3\xa9"}\r\n\r\n'
    b"data: line1\ndata:line2\n\n"
    b"id: 7\rretry: 10\rdata: cr only\r\r"
    b"data: [DONE]\n\n"
    b"data: trailing without blank line"
)


def feed_split(transducer_factory, data: bytes, cuts: list[int]) -> list:  # type: ignore[no-untyped-def]
    t = transducer_factory()
    out: list = []  # type: ignore[type-arg]
    previous = 0
    for cut in sorted(cuts):
        out += t.feed(data[previous:cut])
        previous = cut
    out += t.feed(data[previous:])
    out += t.finish()
    return out


def test_event_decoder_follows_the_spec() -> None:
    events = feed_split(EventDecoder, STREAM, [])
    assert events == [
        ServerSentEvent('{"a": "été"}', "message_start"),
        ServerSentEvent("line1\nline2"),
        ServerSentEvent("cr only", id="7", retry=10),
        ServerSentEvent("[DONE]", id="7", retry=10),
    ]


def test_frame_splitter_keeps_whole_frames_and_drops_a_partial_one() -> None:
    frames = feed_split(FrameSplitter, STREAM, [])
    assert b"".join(frames) == STREAM[: STREAM.index(b"data: trailing")]
    assert len(frames) == 4


def test_every_single_byte_split_point() -> None:
    whole_events = feed_split(EventDecoder, STREAM, [])
    whole_frames = feed_split(FrameSplitter, STREAM, [])
    whole_lines = feed_split(LineDecoder, STREAM, [])
    for cut in range(len(STREAM) + 1):
        assert feed_split(EventDecoder, STREAM, [cut]) == whole_events, cut
        assert b"".join(feed_split(FrameSplitter, STREAM, [cut])) == b"".join(whole_frames), cut
        assert feed_split(LineDecoder, STREAM, [cut]) == whole_lines, cut


@given(st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_split_gives_the_same_output(cuts: list[int]) -> None:
    assert feed_split(EventDecoder, STREAM, cuts) == feed_split(EventDecoder, STREAM, [])
    assert b"".join(feed_split(FrameSplitter, STREAM, cuts)) == b"".join(feed_split(FrameSplitter, STREAM, []))


def test_byte_at_a_time() -> None:
    splitter = FrameSplitter()
    frames = []
    for i in range(len(STREAM)):
        frames += splitter.feed(STREAM[i : i + 1])
    assert frames == feed_split(FrameSplitter, STREAM, [])


def test_frame_splitter_on_lf_only_streams_cuts_where_the_spec_does() -> None:
    """Streams without a CR take a faster path; it must cut exactly where the general one does."""
    data = b"data: a\n\n\ndata: b\n\ndata: c\n\n\n\nrest"
    expected = [b"data: a\n\n", b"\ndata: b\n\n", b"data: c\n\n", b"\n\n"]
    for cut in range(len(data) + 1):
        splitter = FrameSplitter()
        assert splitter.feed(data[:cut]) + splitter.feed(data[cut:]) == expected, cut
        assert splitter.pending == b"rest"
    # A stream that turns to CR line ends halfway goes on from the same state.
    mixed = b"data: a\n\ndata: b\n" + b"\r\ndata: c\r\n\r\n"
    for cut in range(len(mixed) + 1):
        assert feed_split(FrameSplitter, mixed, [cut]) == [b"data: a\n\n", b"data: b\n\r\n", b"data: c\r\n\r\n"], cut


@given(
    st.lists(st.sampled_from([b"data: x", b"\n", b"\n\n", b"\n\n\n", b": c\n", b"\r\n", b"\r"]), max_size=30),
    st.lists(st.integers(0, 200), max_size=8),
)
def test_feed_whole_cuts_where_feed_cuts(parts: list[bytes], cuts: list[int]) -> None:
    data = b"".join(parts)
    by_frame, whole = FrameSplitter(), FrameSplitter()
    previous = 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        piece = data[previous:cut]
        previous = cut
        assert whole.feed_whole(piece) == b"".join(by_frame.feed(piece)), (data, cuts)
        assert whole.pending == by_frame.pending


def test_encode_event_round_trips() -> None:
    raw = encode_event("a\nb", "x") + encode_event(b"{}")
    assert raw == b"event: x\ndata: a\ndata: b\n\ndata: {}\n\n"
    assert feed_split(EventDecoder, raw, []) == [ServerSentEvent("a\nb", "x"), ServerSentEvent("{}")]


def test_an_endless_event_is_refused_not_buffered_forever() -> None:
    big = b"x" * (MAX_EVENT_BYTES // 4)
    for transducer in (FrameSplitter(), LineDecoder(), EventDecoder()):
        with pytest.raises(EventTooLargeError):
            transducer.feed(b"data: ")
            for _ in range(5):
                transducer.feed(big)
    with pytest.raises(EventTooLargeError):
        splitter = FrameSplitter()
        for _ in range(5):
            splitter.feed_whole(big)
    # Many data lines of one event count together.
    decoder = EventDecoder()
    line = b"data: " + b"y" * (1 << 20) + b"\n"
    with pytest.raises(EventTooLargeError):
        for _ in range(17):
            decoder.feed(line)
    # Large events that end are fine.
    assert len(EventDecoder().feed(b"data: " + big + b"\n\n")[0].data) == len(big)
