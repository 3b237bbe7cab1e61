"""The shape of tests/: every toolpair a test runs is built by the one factory in tests/support/proxies.py.

A proxy built by hand elsewhere drifts from how toolpair is really wired (its timeouts, its upstream, its
cleanup) and copies the wiring once more; so the app builder is imported and called in one file only.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FACTORY = TESTS / "support" / "proxies.py"
BUILDER = "create_app"


def _builder_uses(path: Path) -> list[int]:
    """Lines of ``path`` that import or call the app builder."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and any(alias.name == BUILDER for alias in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name == BUILDER:
                lines.append(node.lineno)
    return lines


def test_only_the_factory_builds_a_proxy() -> None:
    found = {
        f"{path.relative_to(TESTS)}:{line}"
        for path in TESTS.rglob("*.py")
        if path != FACTORY
        for line in _builder_uses(path)
    }
    assert not found, f"build test proxies with make_proxy / make_proxy_to (tests/support/proxies.py): {sorted(found)}"


def test_the_check_sees_a_proxy_built_by_hand(tmp_path: Path) -> None:
    stray = tmp_path / "test_stray.py"
    stray.write_text(
        "import proxy.app\nfrom proxy.app import create_app as build\n\n"
        "def test_it():\n    proxy.app.create_app(None)\n    create_app(None)\n"
    )
    assert _builder_uses(stray) == [2, 5, 6]
    assert _builder_uses(FACTORY), "the factory itself builds the app"
