"""What a Responses stream must say when the engine fails after the reply began, checked the same way in the
translation's unit tests and over HTTP."""

from __future__ import annotations

from typing import Any

__all__ = ["failed_response"]


def failed_response(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Asserts that the stream closes its open text part and item, then ends ``response.failed`` with a server error;
    returns that failed response for the caller's own checks."""
    assert [e["type"] for e in events[-3:]] == [
        "response.content_part.done",
        "response.output_item.done",
        "response.failed",
    ]
    failed: dict[str, Any] = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "server_error"
    return failed
