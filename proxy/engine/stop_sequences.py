"""Find the client's stop sequences in generated text ourselves.

Engines report a stop string the same way as an end of turn (llama-cpp-python
answers ``finish_reason: "stop"`` for both), so a front end that must say *which*
stop sequence fired (Anthropic's ``stop_reason: "stop_sequence"``) cannot leave
the matching to the engine. :class:`StopMatcher` watches the text as it streams:
it lets text through as soon as no stop sequence can begin in it, holds back
only a possible partial match, and reports the first stop sequence to complete.

"First to complete" is what a generating model would do: the text is produced
token by token and stops the moment any stop sequence is whole, so the match
that *ends* earliest wins (on a tie, the one that starts earliest). Because
positions are absolute, any split of the text gives the same answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["StopMatch", "StopMatcher"]


@dataclass(frozen=True)
class StopMatch:
    """What one :meth:`StopMatcher.feed` lets through, and the stop sequence that fired, if any."""

    text: str
    stop: str | None = None


class StopMatcher:
    """Text in, text out, with the generation cut before the first stop sequence.

    >>> m = StopMatcher(["\\nUser:"])
    >>> m.feed("Hi.\\nUs"), m.feed("er: more")
    (StopMatch(text='Hi.', stop=None), StopMatch(text='', stop='\\nUser:'))
    """

    __slots__ = ("_held", "_longest", "_stops", "matched")

    def __init__(self, stops: Iterable[str]) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stops if s))
        self._longest = max((len(s) for s in self._stops), default=0)
        self._held = ""
        self.matched: str | None = None

    def feed(self, text: str) -> StopMatch:
        """Add generated text; after a match, everything more is dropped."""
        if self.matched is not None:
            return StopMatch("", self.matched)
        buffer = self._held + text if self._held else text
        best: tuple[int, int, str] | None = None
        for stop in self._stops:
            start = buffer.find(stop)
            if start >= 0:
                key = (start + len(stop), start, stop)
                if best is None or key < best:
                    best = key
        if best is not None:
            self._held = ""
            self.matched = best[2]
            return StopMatch(buffer[: best[1]], best[2])
        hold = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return StopMatch(buffer[: len(buffer) - hold])

    def finish(self) -> str:
        """End of the text: a partial match was not a match, so it is let through."""
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest end of ``buffer`` that some stop sequence begins with."""
        for size in range(min(len(buffer), self._longest - 1), 0, -1):
            tail = buffer[-size:]
            if any(stop.startswith(tail) for stop in self._stops):
                return size
        return 0


END_MARKERS = ("<|im_end|>", "<|im_start|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "</s>")
"""Chat templates' end-of-turn markers. An engine stops when the model writes one whole, but a
reply cut by ``max_tokens`` halfway through writing one ends in its first characters (``<|im``)."""


class EndMarkerGuard:
    """Holds back text at the end of a stream's content that could begin an end-of-turn marker.

    The held text goes out with the next content, or at the end; a reply that ends by length drops
    it, since it was the start of a marker the model had no tokens left to finish.

    >>> guard = EndMarkerGuard()
    >>> guard.feed("Hello <|im"), guard.feed("_"), guard.finish(cut=True)
    ('Hello ', '', '')
    >>> guard.feed("a <"), guard.feed("b"), guard.finish(cut=False)
    ('a ', '<b', '')
    """

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        buffer = self._held + text if self._held else text
        hold = _marker_prefix(buffer)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return buffer[: len(buffer) - hold]

    def finish(self, *, cut: bool) -> str:
        """The held text, or nothing when the reply was ``cut`` by its token limit."""
        held, self._held = self._held, ""
        return "" if cut else held


def _marker_prefix(text: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of an end marker."""
    start = text.rfind("<", max(0, len(text) - 13))
    while start >= 0:
        tail = text[start:]
        if any(marker.startswith(tail) and marker != tail for marker in END_MARKERS):
            return len(tail)
        start = text.rfind("<", max(0, len(text) - 13), start)
    return 0


def strip_end_marker_prefix(text: str) -> str:
    """``text`` without a trailing beginning of an end marker (a whole reply cut by length).

    >>> strip_end_marker_prefix("Sure.<|im"), strip_end_marker_prefix("a < b")
    ('Sure.', 'a < b')
    """
    cut = _marker_prefix(text)
    return text[: len(text) - cut] if cut else text
