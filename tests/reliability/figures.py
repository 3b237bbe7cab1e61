"""The figures the reliability tests measure, gathered for the run's report.

Each test calls :func:`record` with what it measured. At the end of the session
``conftest.py`` writes every figure to ``figures.json`` in a fresh temp dir and
prints them with the path (``docs/reliability.md`` quotes such a run).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["FIGURES", "count", "maximum", "record", "write"]

FIGURES: dict[str, dict[str, Any]] = {}


def record(name: str, **values: Any) -> None:
    """Add ``values`` to the figures of ``name`` (a test or a group of tests)."""
    FIGURES.setdefault(name, {}).update(values)


def count(name: str, key: str, by: int = 1) -> None:
    """Add ``by`` to the counter ``key`` of ``name`` (tests that pass one case at a time)."""
    values = FIGURES.setdefault(name, {})
    values[key] = values.get(key, 0) + by


def maximum(name: str, key: str, value: float) -> None:
    """Keep the largest ``value`` seen under ``key`` of ``name``."""
    values = FIGURES.setdefault(name, {})
    values[key] = max(values.get(key, value), value)


def write() -> Path:
    """Write every figure so far to ``figures.json`` in a new temp dir; returns its path."""
    path = Path(tempfile.mkdtemp(prefix="toolpair-reliability-")) / "figures.json"
    path.write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")
    return path
