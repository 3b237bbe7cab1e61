"""Peak memory of one command run in a fresh Python, for the tests that show a streaming path stays flat.

A fresh process, because this test process has already grown by whatever ran before it; ``ru_maxrss`` of
the child is its own peak.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

__all__ = ["peak_rss_kb"]

ROOT = Path(__file__).resolve().parents[2]


def peak_rss_kb(imports: str, call: str, timeout: float) -> int:
    """The peak resident size (KiB) of a Python that runs ``imports`` then ``code = call`` from the repository root,
    and must exit 0 with that code."""
    script = (
        "import resource, sys\n"
        f"{imports}\n"
        f"code = {call}\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, timeout=timeout, check=True)
    return int(done.stdout.split()[-1])
