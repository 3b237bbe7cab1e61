"""bench/proxy_instructions.py reads a callgrind dump's instruction total as valgrind's own tools do.

The total comes out of a real dump (callgrind over a short program), and is checked against what
``callgrind_annotate`` prints as the program's total; skipped where valgrind is not installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.proxy_instructions import callgrind_total

needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("callgrind_annotate") is None, reason="valgrind not installed"
)


@needs_valgrind
def test_total_is_callgrind_annotates(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    program = [sys.executable, "-S", "-c", "sum(range(1000))"]
    subprocess.run(
        ["valgrind", "--tool=callgrind", "--quiet", f"--callgrind-out-file={out}", *program], check=True, timeout=120
    )
    annotated = subprocess.run(["callgrind_annotate", str(out)], check=True, capture_output=True, text=True).stdout
    program_totals = re.search(r"^\s*([\d,]+)\s.*PROGRAM TOTALS", annotated, re.MULTILINE)
    assert program_totals, annotated[:2000]
    total = callgrind_total(out.read_bytes())
    assert total == int(program_totals.group(1).replace(",", ""))
    assert total > 1_000_000  # Python's start-up alone


def test_a_dump_of_other_events_is_refused() -> None:
    with pytest.raises(ValueError):
        callgrind_total(b"version: 1\nevents: Dr Ir\ntotals: 5 7\n")
    with pytest.raises(ValueError):
        callgrind_total(b"version: 1\nevents: Ir\n")
