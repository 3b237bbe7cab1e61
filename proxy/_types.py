"""Names for the JSON shapes that travel through toolpair.

The core works on plain dicts and lists, exactly as orjson gives them. These
aliases only make signatures say what they expect.
"""

from __future__ import annotations

from typing import Any

JSON = Any
"""Any JSON value as decoded by orjson."""

Message = dict[str, Any]
"""One chat message, Anthropic message or Responses input item."""

Messages = list[Any]
"""A list of messages as received: items are usually dicts, but not trusted to be."""

Body = dict[str, Any]
"""A decoded request or response body."""
