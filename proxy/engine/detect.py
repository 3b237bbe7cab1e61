"""Which engine a sidecar sits in front of, told from what the upstream answered at start-up.

Pure: :func:`detect_engine` reads :class:`ProbeAnswer` values that the edge
(``toolpair proxy``, :mod:`proxy.cli`) collected by asking the upstream, and
decides; :func:`resolve_engine` turns the decision into settings. Nothing here
does I/O.

How llama-server is told: every answer of llama.cpp's HTTP server, whatever
the path, status or API key, carries the header ``Server: llama.cpp``; its
``/health`` is open without a key, and answers even while the model loads
(503). ``/props``, when it can be read, adds the build. Anything else is a
``generic`` engine: toolpair changes nothing but the order of tool results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.config import ApiMode, EngineKind, Settings

__all__ = ["PROBE_PATHS", "Detection", "ProbeAnswer", "api_modes", "detect_engine", "engine_lines", "resolve_engine"]

PROBE_PATHS = ("/health", "/props")
"""What the edge asks the upstream, in order: both GETs, without a body."""

LLAMA_SERVER_HEADER = "llama.cpp"


@dataclass(frozen=True)
class ProbeAnswer:
    """What one probe got back: a status and headers, or the error that stood in for them."""

    path: str
    status: int | None = None
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Lower-case names."""
    body: Any = None
    """The decoded JSON body, if it was JSON."""
    error: str | None = None
    """Why there was no answer (refused, timed out)."""


@dataclass(frozen=True)
class Detection:
    """The engine kind found, and how it was told (for the start-up banner)."""

    kind: EngineKind
    how: str
    detected: bool
    """False when the kind was named (``--engine-kind``) rather than detected."""


def detect_engine(answers: Sequence[ProbeAnswer]) -> Detection:
    """The engine behind these probe answers.

    >>> health = ProbeAnswer("/health", 200, {"server": "llama.cpp"})
    >>> props = ProbeAnswer("/props", 200, {"server": "llama.cpp"}, {"build_info": "b11434-7d4a3b0"})
    >>> detect_engine([health, props]).how
    '/health answered with "Server: llama.cpp" (llama.cpp build b11434-7d4a3b0)'
    >>> detect_engine([ProbeAnswer("/health", 200, {"server": "uvicorn"})]).kind.value
    'generic'
    >>> detect_engine([ProbeAnswer("/health", error="connection refused")]).how
    'the upstream did not answer (/health: connection refused): assuming a generic engine'
    """
    answered = [a for a in answers if a.status is not None]
    if not answered:
        errors = "; ".join(f"{a.path}: {a.error}" for a in answers) or "nothing asked"
        return Detection(EngineKind.GENERIC, f"the upstream did not answer ({errors}): assuming a generic engine", True)
    llama = [a for a in answered if a.headers.get("server", "").strip().lower().startswith(LLAMA_SERVER_HEADER)]
    if not llama:
        servers = sorted({a.headers["server"] for a in answered if a.headers.get("server")})
        said = f"Server: {', '.join(servers)}" if servers else "no Server header"
        return Detection(EngineKind.GENERIC, f"not llama-server ({said}): a generic engine", True)
    how = f'{llama[0].path} answered with "Server: {LLAMA_SERVER_HEADER}"'
    build = next(
        (
            a.body["build_info"]
            for a in answered
            if isinstance(a.body, dict) and isinstance(a.body.get("build_info"), str)
        ),
        None,
    )
    if build:
        how += f" (llama.cpp build {build})"
    return Detection(EngineKind.LLAMA_SERVER, how, True)


def resolve_engine(settings: Settings, answers: Sequence[ProbeAnswer] | None) -> tuple[Settings, Detection]:
    """``settings`` with ``engine_kind: auto`` replaced by what the probes found; a named kind is kept.

    ``answers`` is None when nothing was asked (the kind was named). The API modes follow the kind
    (``auto`` is native for llama-server), so they need no change here.

    >>> named, found = resolve_engine(Settings(engine_kind="llama-cpp-python"), None)
    >>> named.engine_kind.value, found.detected
    ('llama-cpp-python', False)
    """
    if settings.engine_kind is not EngineKind.AUTO:
        return settings, Detection(settings.engine_kind, "named in the settings (engine_kind)", False)
    found = detect_engine(answers or ())
    return dataclasses.replace(settings, engine_kind=found.kind), found


def api_modes(settings: Settings) -> dict[str, ApiMode]:
    """How each API other than Chat reaches the engine with these (resolved) settings.

    >>> {k: v.value for k, v in api_modes(Settings(engine_kind="llama-server")).items()}
    {'/v1/messages': 'native', '/v1/responses': 'native'}
    """
    return {
        "/v1/messages": settings.messages_mode.resolve(settings.engine_kind),
        "/v1/responses": settings.responses_mode.resolve(settings.engine_kind),
    }


_CHANGES = {
    EngineKind.GENERIC: "nothing but the order of tool results",
    EngineKind.LLAMA_SERVER: "the order of tool results; tool_choice allowed_tools narrowed (docs/engine.md)",
    EngineKind.LLAMA_CPP_PYTHON: "requests reshaped to fit it, tool calls read out of its text (docs/engine.md)",
}


def engine_lines(settings: Settings, found: Detection | None) -> list[str]:
    """The banner's lines on the engine: what it is and how that was told, what toolpair changes, each API's route.

    ``found`` None: nothing answered yet (``toolpair proxy`` listens at once and finds it in the background).

    >>> print(engine_lines(Settings(), None)[0])
      engine:         not known yet: toolpair asks the upstream in the background (the log says what and when)
    >>> found = detect_engine([ProbeAnswer("/health", 200, {"server": "llama.cpp"})])
    >>> print(engine_lines(Settings(engine_kind="llama-server"), found)[0])
      engine:         llama-server (detected: /health answered with "Server: llama.cpp")
    """
    if found is None:
        return [
            "  engine:         not known yet: toolpair asks the upstream in the background (the log says what and when)"
        ]
    how = f"detected: {found.how}" if found.detected and found.kind is not EngineKind.GENERIC else found.how
    modes = api_modes(settings)
    planned = settings.responses_mode is ApiMode.AUTO and modes["/v1/responses"] is ApiMode.NATIVE
    responses = (
        "native when the engine takes it whole, else translated (X-Toolpair-Route says which)"
        if planned
        else _mode_text(modes["/v1/responses"])
    )
    return [
        f"  engine:         {settings.engine_kind.value} ({how})",
        f"  changes:        {_CHANGES.get(settings.engine_kind, '')}",
        "  /v1/messages:   " + _mode_text(modes["/v1/messages"]) + "   /v1/responses: " + responses,
    ]


def _mode_text(mode: ApiMode) -> str:
    return "native (the engine serves it)" if mode is ApiMode.NATIVE else "translated to Chat Completions"
