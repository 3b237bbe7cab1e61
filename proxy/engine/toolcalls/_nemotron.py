"""Nemotron Nano v2 calls: a JSON array of ``{"name", "arguments"}`` objects in ``<TOOLCALL>``.

As its template renders two calls (after the turn's ``</think>``)::

    <TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", ...}]</TOOLCALL>

The array is read by :mod:`._jsonlist`.
"""

from __future__ import annotations

from proxy.engine.toolcalls._jsonlist import ListFormat

__all__ = ["NEMOTRON", "NEMOTRON_OPEN"]

NEMOTRON_OPEN = "<TOOLCALL>"
NEMOTRON = ListFormat("</TOOLCALL>")
