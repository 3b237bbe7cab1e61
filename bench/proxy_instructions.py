"""CPU instructions per request of toolpair and of the floor proxy, counted by valgrind's callgrind.

The same processes as ``bench/proxy_overhead.py`` (whose code this reuses): the
mock engine, a toolpair sidecar in front of it and the floor proxy (one bare
aiohttp hop) in front of it, on loopback. Each proxy runs under ``valgrind
--tool=callgrind`` with instrumentation off at start, so start-up is not
counted (nor slowed 50-fold). Once both answer, instrumentation is switched on
with ``callgrind_control``, a warm-up of requests runs, the counters are zeroed,
the measured requests are sent (each proxy the same ones, interleaved) and the
counters dumped: what the dump counts is the measured requests alone, divided by
their number. Then the same for the next case.

Instruction counts barely move with the machine's load (timers and background
polls move them by a few percent), unlike wall or CPU time, so on a shared
machine they are the figure to compare between two versions of the code.
``--against DIR`` runs a toolpair from another checkout (say, main) as a third
proxy in the same run, for a before/after.

Callgrind counts user-space instructions only: the kernel's work to receive and
send the bytes is not in them, which matters for the large case (the floor's
CPU time there is mostly the kernel's).

Run: ``make bench-instructions`` (or ``python bench/proxy_instructions.py --help``).
Needs valgrind (``apt-get install valgrind``); a benchmark, it checks nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.proxy_overhead import (  # noqa: E402
    floor_command,
    free_port,
    large_request,
    small_request,
    start,
    timed_post,
    toolpair_command,
    wait_up,
)

_TOTALS = re.compile(rb"^(?:totals|summary):\s+(\d+)", re.MULTILINE)


def callgrind_total(dump: bytes) -> int:
    """The first event's total (instructions, ``Ir``) in one callgrind output file.

    A dump states it in a ``totals:`` line (older versions: ``summary:``); the
    first event is ``Ir`` unless callgrind was told to collect others first.
    """
    events = re.search(rb"^events:\s+(\S+)", dump, re.MULTILINE)
    if events is None or events.group(1) != b"Ir":
        raise ValueError("not a callgrind dump whose first event is Ir")
    found = _TOTALS.findall(dump)
    if not found:
        raise ValueError("callgrind dump without a totals line")
    return int(found[-1])


def valgrind_command(out_dir: Path, name: str) -> list[str]:
    """Callgrind with instrumentation off until asked, each dump a file in ``out_dir`` named for ``name``."""
    return [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out_dir / name}.%p",
        "--quiet",
    ]


@dataclass
class Counted:
    """One proxy under callgrind: its name, URL, process and where its dumps go."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    out_dir: Path

    def control(self, *args: str) -> None:
        subprocess.run(
            ["callgrind_control", *args, str(self.process.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=120,
        )

    def dump(self) -> int:
        """Dump the counters since the last zero and return their instruction total."""
        before = set(self.out_dir.glob(f"{self.name}.*"))
        self.control("--dump")
        for _ in range(600):
            new = sorted(set(self.out_dir.glob(f"{self.name}.*")) - before)
            if new:
                text = new[-1].read_bytes()
                if _TOTALS.search(text):
                    return callgrind_total(text)
            time.sleep(0.05)
        raise RuntimeError(f"callgrind wrote no dump for {self.name}")


async def measure(
    session: aiohttp.ClientSession, proxies: Sequence[Counted], body: bytes, n: int, warmup: int
) -> dict[str, float]:
    """Instructions per request of each proxy over ``n`` requests of ``body``, after ``warmup`` of them."""
    sides = len(proxies)
    for round_no in range(warmup):
        for k in range(sides):
            await timed_post(session, proxies[(round_no + k) % sides].url, body)
    for proxy in proxies:
        proxy.control("--zero")
    for round_no in range(n):  # a rotating order, as proxy_overhead's Contest: no proxy always goes first
        for k in range(sides):
            await timed_post(session, proxies[(round_no + k) % sides].url, body)
    return {proxy.name: proxy.dump() / n for proxy in proxies}


PACKAGES = ("proxy", "engine_launcher")
"""What a toolpair sidecar runs from: copied out of each checkout, see :func:`same_length_copies`."""


def same_length_copies(roots: Sequence[Path], into: Path) -> list[Path]:
    """Each checkout's packages copied to ``into/1``, ``into/2``, ...: paths of one length.

    The count moves with where the code lies (about 2% between two checkouts of the same commit at
    paths of different lengths, more than many a change is worth): the paths end up in strings made
    at start-up, which shifts where later objects are allocated, and CPython's type attribute cache
    is indexed by addresses. Copies at paths of one length, under a temporary folder whose name
    always has the same length, make runs from any checkout comparable.
    """
    copies = []
    for number, root in enumerate(roots, 1):
        copy = into / str(number)
        for package in PACKAGES:
            shutil.copytree(root / package, copy / package, ignore=shutil.ignore_patterns("__pycache__"))
        copies.append(copy)
    return copies


async def run(args: argparse.Namespace, out_dir: Path) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="toolpair-sides-") as sides_dir:
        roots = [ROOT, *([args.against.resolve()] if args.against else [])]
        return await count(args, out_dir, same_length_copies(roots, Path(sides_dir)))


async def count(args: argparse.Namespace, out_dir: Path, roots: Sequence[Path]) -> dict[str, dict[str, float]]:
    engine_port = free_port()
    direct = f"http://127.0.0.1:{engine_port}"
    engine = start([sys.executable, "-m", "tests.mock_engine", "--port", str(engine_port)])
    processes = [engine]
    proxies: list[Counted] = []
    try:
        sides = [("floor", floor_command, ROOT), ("toolpair", toolpair_command, roots[0])]
        if args.against:
            sides.append(("against", toolpair_command, roots[1]))
        for name, command, root in sides:
            port = free_port()
            process = start([*valgrind_command(out_dir, name), *command(direct, port)], root)
            processes.append(process)
            proxies.append(Counted(name, f"http://127.0.0.1:{port}", process, out_dir))
        async with aiohttp.ClientSession() as session:
            for url in (direct, *(p.url for p in proxies)):
                await wait_up(session, url, seconds=180.0)
            for proxy in proxies:
                proxy.control("--instr=on")
            results = {}
            for case, body, n in (("small", small_request(), args.small), ("large", large_request(), args.large)):
                results[case] = await measure(session, proxies, body, n, args.warmup)
                results[case]["bytes"] = len(body)
            return results
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=100, help="measured small requests per proxy")
    parser.add_argument("--large", type=int, default=40, help="measured large requests per proxy")
    parser.add_argument("--warmup", type=int, default=20, help="requests per proxy and case before counting")
    parser.add_argument("--against", type=Path, help="another checkout whose toolpair is counted too")
    parser.add_argument("--json", action="store_true", help="print raw results as JSON")
    parser.add_argument(
        "--keep",
        type=Path,
        help="keep callgrind's dumps in this folder (NAME.PID.1 small, .2 large) for callgrind_annotate",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind is not installed (apt-get install valgrind; `make bench-instructions` does it)")
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        results = asyncio.run(run(args, args.keep.resolve()))
    else:
        with tempfile.TemporaryDirectory(prefix="toolpair-callgrind-") as out:
            results = asyncio.run(run(args, Path(out)))
    if args.json:
        print(orjson.dumps(results, option=orjson.OPT_INDENT_2).decode())
        return
    names = ["toolpair", *(["against"] if args.against else [])]
    print(f"{'case (instructions/request)':<28}{'floor':>12}" + "".join(f"{n:>12}{'x floor':>9}" for n in names))
    for case, label in (("small", "small chat"), ("large", "large reorder")):
        r = results[case]
        title = f"{label} ({r['bytes'] / 1e3:.1f} KB)"
        row = f"{title:<28}{r['floor']:>12,.0f}"
        for name in names:
            row += f"{r[name]:>12,.0f}{r[name] / r['floor']:>8.2f}x"
        print(row)
    if args.against:
        print(f"against: {args.against}")


if __name__ == "__main__":
    main()
