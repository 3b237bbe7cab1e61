"""What the text extractor emits, what a format parser returns, and call IDs."""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "Content",
    "Event",
    "IdSource",
    "ParsedCall",
    "Reasoning",
    "Step",
    "StepState",
    "ToolCall",
    "random_call_id",
]

_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class Content:
    """Text that stays in ``content``."""

    text: str


@dataclass(frozen=True)
class Reasoning:
    """Text from a ``<think>`` block, bound for ``reasoning_content``."""

    text: str


@dataclass(frozen=True)
class ToolCall:
    """One complete, well-formed call; ``index`` counts calls in this reply from 0."""

    index: int
    id: str
    name: str
    arguments: str


Event = Content | Reasoning | ToolCall

IdStyle = Literal["openai", "mistral"]
IdSource = Callable[[IdStyle], str]
"""Makes a call ID in a style: ``openai`` is ``call_`` plus 24 characters, ``mistral`` 9 alphanumerics."""


def random_call_id(style: IdStyle) -> str:
    """A fresh call ID.

    >>> len(random_call_id("openai")), len(random_call_id("mistral"))
    (29, 9)
    """
    if style == "mistral":
        return "".join(secrets.choice(_ALNUM) for _ in range(9))
    return "call_" + "".join(secrets.choice(_ALNUM) for _ in range(24))


@dataclass(frozen=True)
class ParsedCall:
    """A call as a format parser read it, before it gets its index."""

    name: str
    arguments: str
    id: str | None = None
    id_style: IdStyle = "openai"


StepState = Literal["more", "done", "fail"]


@dataclass
class Step:
    """A format parser's answer after reading the text that follows its start marker.

    ``calls`` are the calls completed by this step. ``state`` is ``more`` (the
    block is undecided: keep the text), ``done`` (the block ended at
    ``consumed``) or ``fail`` (malformed from ``consumed`` on: that text is
    plain content; with ``consumed == 0`` and no call so far, the marker too,
    and the first ``literal`` characters after it are not searched for markers
    again).
    """

    state: StepState
    consumed: int = 0
    calls: list[ParsedCall] = field(default_factory=list)
    literal: int = 0
