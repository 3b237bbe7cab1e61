"""Throughput of reading tool calls out of model text, per format, beside a floor (a benchmark, not a test).

For each call format ``toolpair serve`` reads, one released template that teaches it (from the
pinned llama.cpp tree that ``bench/template_survey.py`` fetches) writes its own turn of two parallel
calls (``check-template``'s written turn). A reply is some prose the model writes first, then that
turn; the replies are fed to the extractor that serve sets up from the template (the same
``follow_template`` -> ``engine_setup`` -> ``reply_plan`` path) in 4-character pieces, as an engine
streams them, and each reply ends with ``finish()``.

The floor does the least any reader must: one scan of each piece for the format's first marker
character (``str.find``), in the same loop. It prints MB/s of model text for both and their ratio.
The issue's target is 50 MB/s per format; any engine writes well under 1 MB/s of text.

    python bench/toolcall_throughput.py [--mb 2] [--piece 4] [--format NAME]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.template_survey import fetch_templates  # noqa: E402
from engine_launcher.templates.template_check import WRITTEN_TOOLS, template_from_file_text, written_turn  # noqa: E402
from proxy.config import Settings  # noqa: E402
from proxy.engine.plan import engine_setup, follow_template, reply_plan  # noqa: E402
from proxy.engine.toolcalls import ExtractOptions, TextExtractor  # noqa: E402

PROSE = (
    "Let me look at both cities first. The forecast service answers per city, so I will ask for "
    "Paris and for Tokyo at once and compare what comes back; then I can say which one is warmer. "
) * 4


def one_per_format(folder: Path) -> dict[str, tuple[str, ExtractOptions, str]]:
    """format -> (template name, extract options as serve sets them, the reply text), the first template per format."""
    found: dict[str, tuple[str, ExtractOptions, str]] = {}
    for path in sorted(folder.glob("*.jinja"), key=lambda p: p.name.lower()):
        text = path.read_text(encoding="utf-8")
        settings = follow_template(Settings(engine_kind="llama-cpp-python"), text)
        fmt = settings.tool_call_format
        if fmt in found or fmt == "auto":
            continue
        try:
            turn = written_turn(template_from_file_text(text, path.stem))
        except Exception:  # a template that does not render this turn has no row
            continue
        if turn is None or len(turn.calls) != 2:
            continue
        body = {"messages": [{"role": "user", "content": "Hi"}], "tools": WRITTEN_TOOLS}
        plan = reply_plan(body, engine_setup(settings))
        if plan is None:
            continue
        # Prose first (reasoning where the prompt opens it); harmony's turn is all channel messages.
        for reply in (PROSE + turn.text, turn.text):
            if extractor_rate(plan.extract, pieces(reply, 4), 1)[1] == 2:  # a template whose turn is read back
                found[fmt] = (path.stem, plan.extract, reply)
                break
    return found


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def extractor_rate(options: ExtractOptions, reply: list[str], replies: int) -> tuple[float, int]:
    """MB/s of text through the extractor, and the calls it read (a check that it read them)."""
    calls = 0
    started = time.perf_counter()
    for _ in range(replies):
        extractor = TextExtractor(options)
        for piece in reply:
            for event in extractor.feed(piece):
                calls += type(event).__name__ == "ToolCall"
        for event in extractor.finish():
            calls += type(event).__name__ == "ToolCall"
    elapsed = time.perf_counter() - started
    return sum(map(len, reply)) * replies / elapsed / 1e6, calls


def floor_rate(reply: list[str], replies: int, marker: str) -> float:
    """MB/s of a loop that only looks once at each piece for the marker's first character."""
    first = marker[:1] or "<"
    seen = 0
    started = time.perf_counter()
    for _ in range(replies):
        for piece in reply:
            if piece.find(first) >= 0:
                seen += 1
    elapsed = time.perf_counter() - started
    return sum(map(len, reply)) * replies / elapsed / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=2.0, help="MB of model text per format (default 2)")
    parser.add_argument("--piece", type=int, default=4, help="characters per piece fed (default 4)")
    parser.add_argument("--format", action="append", help="only this format (repeatable)")
    args = parser.parse_args()
    rows = one_per_format(fetch_templates())
    print(f"{'format':<17} {'template':<40} {'extractor MB/s':>14} {'floor MB/s':>10} {'x floor':>8}")
    for fmt, (name, options, text) in sorted(rows.items()):
        if args.format and fmt not in args.format:
            continue
        reply = pieces(text, args.piece)
        replies = max(1, int(args.mb * 1e6 / len(text)))
        rate, calls = extractor_rate(options, reply, replies)
        if calls != 2 * replies:
            print(f"{fmt:<17} {name:<40} read {calls} calls of {2 * replies}: not read back, no rate")
            continue
        floor = floor_rate(reply, replies, text[len(PROSE) :].removeprefix("</think>").lstrip())
        print(f"{fmt:<17} {name:<40} {rate:>14.1f} {floor:>10.1f} {rate / floor:>7.2f}x")
    print(f"target: at least 50 MB/s per format, fed in {args.piece}-character pieces")


if __name__ == "__main__":
    main()
