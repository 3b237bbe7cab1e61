"""The README and docs/ link to each other and into the tree; every such link must land.

Pages move (the README is a front door, the reference lives in docs/) and modules get renamed, so a
link to a file or a heading that no longer exists is the likeliest way for the docs to rot.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_PATH = re.compile(r"`((?:proxy|engine_launcher|tests|bench|scripts|config)/[A-Za-z0-9_./-]*)`")


def github_anchor(heading: str) -> str:
    """The id GitHub gives a heading: ``## OpenAI Responses (`/v1/responses`)`` -> ``openai-responses-v1responses``."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def links(page: Path) -> list[str]:
    return LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8")))


def test_github_anchor_matches_githubs_rule() -> None:
    assert github_anchor("OpenAI Responses (`/v1/responses`)") == "openai-responses-v1responses"
    assert github_anchor("What it changes, and what it leaves alone") == "what-it-changes-and-what-it-leaves-alone"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_lands_on_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_path_named_in_code_quotes_exists(page: Path) -> None:
    if page.name == "reliability.md":
        pytest.skip("names modules as they were when each bug was fixed")
    missing = []
    for path in CODE_PATH.findall(page.read_text(encoding="utf-8")):
        candidate = path.split("::")[0].rstrip(".")
        if any(ch in candidate for ch in "*<>") or not candidate.endswith(
            (".py", "/", ".yaml", ".yml", ".sh", ".json")
        ):
            continue
        if not (ROOT / candidate).exists():
            missing.append(candidate)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def test_readme_is_a_front_door() -> None:
    """A contents list near the top, and every docs/ page reachable from the README."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "## Contents" in readme.split("## The problem")[0]
    linked = {Path(t.partition("#")[0]).name for t in links(ROOT / "README.md") if t.startswith("docs/")}
    unlinked = sorted(p.name for p in (ROOT / "docs").glob("*.md") if p.name not in linked)
    assert not unlinked, f"docs pages the README does not link: {unlinked}"
