"""The relay's Chat stream checks on whole-frame slices decide as the frame-by-frame rule does, for any chunking."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.errors import UpstreamError
from proxy.http.relay import _CompletionFrames
from proxy.sse import FrameSplitter

PARTS = [
    b'data: {"choices":[{"delta":{"content":"x"}}]}',
    b'data: {"error":{"message":"m"}}',
    b'data: {"id":"no keys"}',
    b'data:{"choices":[]}',
    b"data: [DONE]",
    b"data: not json",
    b"data:  [DONE]",
    b": ping",
    b"event: e\n",
    b"\n",
    b"\n\n",
    b"\n\n\n",
    b"\r\n",
    b"\r",
    b"\r\r",
]


def _outcome(check: _CompletionFrames, feed: object) -> str:
    try:
        feed()  # type: ignore[operator]
    except UpstreamError:
        return "refused"
    return f"done={check._done}"


@given(st.lists(st.sampled_from(PARTS), max_size=24), st.lists(st.integers(0, 400), max_size=8))
def test_slices_decide_as_frames_do(parts: list[bytes], cuts: list[int]) -> None:
    data = b"".join(parts)
    by_frame, whole = FrameSplitter(), FrameSplitter()
    reference, checks = _CompletionFrames("u"), _CompletionFrames("u")
    previous = 0
    for cut in [*sorted(c for c in cuts if c <= len(data)), len(data)]:
        piece, previous = data[previous:cut], cut
        frames, slice_ = by_frame.feed(piece), whole.feed_whole(piece)
        expected = _outcome(reference, lambda frames=frames: reference._feed_frames(frames))
        got = _outcome(checks, lambda slice_=slice_: checks.feed(slice_) if slice_ else None)
        assert got == expected, (data, cuts)
        if expected == "refused":
            return


def test_a_frame_ending_in_a_lone_cr_is_checked_too() -> None:
    """A fresh splitter holds back a frame that ends in CR (it waits to see no LF follows): it is still checked."""
    whole = FrameSplitter()
    slice_ = whole.feed_whole(b"data: [DONE]\r\r") + whole.feed_whole(b"x")
    assert slice_ == b"data: [DONE]\r\r"
    checks = _CompletionFrames("u")
    checks.feed(slice_)
    checks.finish()  # [DONE] was seen
    with pytest.raises(UpstreamError, match="not a completion chunk"):
        _CompletionFrames("u").feed(b"data: nope\r\r")
