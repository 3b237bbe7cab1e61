"""The shape of proxy/ and engine_launcher/: no import cycle, and no project import hides in a function.

A function-local import is how a cycle gets hidden; with none, the module-level graph is the whole
graph, and the check below sees every edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("proxy", "engine_launcher")


def _modules() -> dict[str, Path]:
    modules = {}
    for path in (p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    return modules


def _imports(tree: ast.Module, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """Every project module this tree imports, with the column of the import statement."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGES):
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [(name, node.col_offset) for name in names if name in modules]
    return found


_DELIBERATE = {
    # The entry point picks a subcommand before loading it: normalize starts without the server.
    ("proxy.__main__", "proxy.normalize.cli"),
    ("proxy.__main__", "proxy.normalize.cli.main"),
    ("proxy.__main__", "proxy.cli"),
    ("proxy.__main__", "proxy.cli.main"),
    # Parquet needs pyarrow, an optional extra.
    ("proxy.normalize.cli", "proxy.normalize.parquet"),
    ("proxy.normalize.cli", "proxy.normalize.parquet.ParquetInput"),
    ("proxy.normalize.cli", "proxy.normalize.parquet.normalize_parquet"),
}
"""Function-local imports with a reason other than a cycle."""


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    local = []
    for name, path in modules.items():
        for target, column in _imports(ast.parse(path.read_text()), modules):
            if column and (name, target) not in _DELIBERATE:
                local.append(f"{name} imports {target} inside a block")
            elif target != name:
                graph[name].add(target)
    return graph, local


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state and (found := visit(target)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_project_imports_form_no_cycle_and_none_hides_in_a_function() -> None:
    graph, local = _graph()
    assert local == []
    assert _cycle(graph) is None


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


COMMANDS = tuple(
    f"proxy.cli.{path.stem}"
    for path in sorted((ROOT / "proxy" / "cli").glob("*.py"))
    if path.stem not in ("__init__", "parser", "common")
)
"""One module per ``toolpair`` command."""

LAYERS = (
    ("proxy.__main__",),
    ("proxy.cli", "proxy.cli.parser"),
    COMMANDS,
    ("proxy.cli.common",),
    ("proxy.serve",),
    ("proxy.banner",),
    ("proxy.serve_plan",),
    ("proxy.serve_memory", "proxy.app"),
    ("proxy.dialects",),
    ("proxy.http",),
    ("proxy.engine",),
    ("proxy.ops", "proxy.normalize"),
    ("proxy.order", "proxy.sse", "proxy.errors", "proxy.config", "proxy._types", "proxy"),
    ("engine_launcher.supervise",),
    ("engine_launcher.inside",),
    ("engine_launcher.templates",),
    ("engine_launcher.builder", "engine_launcher"),
)
"""proxy/ from the top down, then engine_launcher/: a module imports only from its own layer or below.

engine_launcher/ lies below the proxy: the proxy calls it, and it never imports the proxy. Inside it, a
package per program, from the top: the supervisor in toolpair's process, the code that runs in the
engine's process, the chat templates, and at the bottom the build (the Docker image's engine layer,
which imports nothing above it).

The top layers are the entry points: ``__main__``, the command line (``proxy/cli/``: the parser put
together, then one module per command, then what commands share), ``serve`` (the managed engine's
wiring and run loop), the start-up banners, serve's plan and its memory plan; then ``app``, the one
module that wires the layers below together. ``proxy`` itself (its version) is a leaf."""


def _layer(module: str) -> int:
    """The layer of ``module``: that of the most specific member naming it or a package above it."""
    found = [
        (len(member), depth)
        for depth, members in enumerate(LAYERS)
        for member in members
        if module == member or (member not in ("proxy", "engine_launcher") and module.startswith(member + "."))
    ]
    if not found:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS")
    return max(found)[1]


def _upward(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{name} -> {target}" for name, targets in graph.items() for target in targets if _layer(target) < _layer(name)
    )


def test_no_import_runs_back_up_a_layer() -> None:
    graph, _ = _graph()
    assert _upward(graph) == []


def test_the_layer_check_sees_an_import_that_runs_up() -> None:
    assert _upward({"proxy.ops.paths": {"proxy.http.body"}, "proxy.http.body": {"proxy.order"}}) == [
        "proxy.ops.paths -> proxy.http.body"
    ]


def test_each_command_stands_alone() -> None:
    """A command module imports no other command's: what two commands share lives in ``proxy.cli.common``."""
    graph, _ = _graph()
    assert COMMANDS, "proxy/cli/ holds the commands"
    assert sorted(f"{name} -> {target}" for name in COMMANDS for target in graph[name] if target in COMMANDS) == []


def test_the_cli_layers_see_a_command_that_imports_the_parser() -> None:
    assert _upward({"proxy.cli.serve": {"proxy.cli.parser"}, "proxy.cli.common": {"proxy.cli.proxy"}}) == [
        "proxy.cli.common -> proxy.cli.proxy",
        "proxy.cli.serve -> proxy.cli.parser",
    ]


def test_the_layer_check_sees_engine_launcher_packages_import_back_up() -> None:
    assert _upward(
        {
            "engine_launcher.builder.install": {"engine_launcher.supervise.launch"},
            "engine_launcher.templates.chat_template": {"engine_launcher.inside.engine_main"},
            "engine_launcher.supervise.launch": {"engine_launcher.builder.backends"},
        }
    ) == [
        "engine_launcher.builder.install -> engine_launcher.supervise.launch",
        "engine_launcher.templates.chat_template -> engine_launcher.inside.engine_main",
    ]


def test_every_engine_launcher_module_sits_in_a_package_of_its_program() -> None:
    """A module at engine_launcher's top would belong to no program (and to no layer of the image)."""
    loose = sorted(name for name in _modules() if name.count(".") == 1 and name.startswith("engine_launcher."))
    assert loose == [
        "engine_launcher.builder",
        "engine_launcher.inside",
        "engine_launcher.supervise",
        "engine_launcher.templates",
    ]
