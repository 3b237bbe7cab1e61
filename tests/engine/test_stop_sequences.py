"""The stop-sequence matcher: what it lets through, what it holds back, which stop fires."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.engine.stop_sequences import StopMatch, StopMatcher


def run(stops: list[str], pieces: list[str]) -> tuple[str, str | None]:
    """Feed pieces until a stop fires; the text let through and the stop."""
    matcher = StopMatcher(stops)
    out = []
    for piece in pieces:
        match = matcher.feed(piece)
        out.append(match.text)
        if match.stop is not None:
            return "".join(out), match.stop
    out.append(matcher.finish())
    return "".join(out), None


def test_text_with_no_possible_match_is_let_through_at_once() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("hello ") == StopMatch("hello ")
    assert matcher.feed("world") == StopMatch("world")
    assert matcher.finish() == ""


def test_only_a_possible_partial_match_is_held_back() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("abc ST") == StopMatch("abc ")
    assert matcher.feed("ARTS") == StopMatch("START")  # "START" can no longer begin "STOP"; "S" can
    assert matcher.feed("") == StopMatch("")
    assert matcher.finish() == "S"


def test_the_match_cuts_the_text_and_names_the_stop() -> None:
    matcher = StopMatcher(["</answer>", "\n\n"])
    assert matcher.feed("42</ans") == StopMatch("42")
    assert matcher.feed("wer> and more") == StopMatch("", "</answer>")
    assert matcher.matched == "</answer>"
    assert matcher.feed("ignored") == StopMatch("", "</answer>")


def test_the_stop_that_completes_first_wins_as_a_generating_model_would() -> None:
    # "abcd" starts earlier, but "bc" is complete one character sooner.
    assert run(["abcd", "bc"], ["abcd"]) == ("a", "bc")
    assert run(["abcd", "bc"], ["a", "b", "c", "d"]) == ("a", "bc")
    # On a tie at the end, the longer (earlier-starting) one wins.
    assert run(["c", "abc"], ["xabc"]) == ("x", "abc")


def test_no_stops_and_empty_stops_match_nothing() -> None:
    assert run([], ["anything"]) == ("anything", None)
    assert run([""], ["anything"]) == ("anything", None)


def test_multibyte_text_and_a_stop_at_the_very_start() -> None:
    assert run(["é!"], ["caf", "é", "!x"]) == ("caf", "é!")
    assert run(["Hi"], ["Hi there"]) == ("", "Hi")


@given(
    text=st.text(alphabet="abc\n", max_size=30),
    stops=st.lists(st.text(alphabet="abc\n", min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=30), max_size=6),
)
def test_any_split_gives_the_same_answer_as_the_whole_text(text: str, stops: list[str], cuts: list[int]) -> None:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    whole = run(stops, [text])
    assert run(stops, pieces) == whole
    # And the answer is right: the text before the earliest-ending match, or all of it.
    found = [(text.find(s) + len(s), text.find(s), s) for s in stops if s in text]
    if found:
        _end, start, stop = min(found)
        assert whole == (text[:start], stop)
    else:
        assert whole == (text, None)
