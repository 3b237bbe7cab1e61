"""How long `toolpair serve` takes to start, to restart a killed engine, and to shut down.

Runs `toolpair serve` (bundled model unless --model) several times and reports, per run:

- start-up: process launch to the first 200 from /ready (model assembly cached, engine loaded and
  warmed up: /ready waits for the engine's warm-up generation);
- warm-up: the part of start-up that the warm-up generation took (serve's log says it);
- restart: SIGKILL of the engine to /ready answering 200 again (includes the 0.5 s backoff);
- shutdown: SIGTERM to toolpair's exit, engine stopped.

    python bench/engine_startup.py [--runs 3] [--model PATH]

Results are printed and written to bench/results/engine_startup.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine_launcher.supervise.launch import free_port  # noqa: E402


def ready(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url + "/ready", timeout=2) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except OSError:
        return 0, {}


def wait_for(check: object, limit: float = 300.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return
        time.sleep(0.02)
    raise SystemExit("timed out")


def engine_of(pid: int) -> int:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                argv = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == pid and b"llama_cpp.server" in argv:
                return int(entry.name)
    raise SystemExit("no engine process found")


_WARMUP = re.compile(rb"warm-up generation (\d+(?:\.\d+)?)s")


def warmups(log: Path) -> list[float]:
    """Every warm-up time serve's log reports, in order (one per engine start)."""
    return [float(m.group(1)) for m in _WARMUP.finditer(log.read_bytes())]


def one_run(model: str | None, log: Path) -> dict[str, float]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "proxy", "serve", "--port", str(port), *(["--model", model] if model else [])]
    started = time.monotonic()
    with log.open("ab") as sink:
        process = subprocess.Popen(command, cwd=ROOT, stdout=sink, stderr=sink)
    try:
        seen = len(warmups(log)) if log.exists() else 0
        wait_for(lambda: ready(url)[0] == 200)
        startup = time.monotonic() - started
        wait_for(lambda: len(warmups(log)) > seen, 10)
        warmup = warmups(log)[seen]
        engine = engine_of(process.pid)
        killed = time.monotonic()
        os.kill(engine, signal.SIGKILL)
        wait_for(lambda: (r := ready(url))[0] == 200 and r[1]["engine"]["restarts"] == 1)  # type: ignore[index]
        restart = time.monotonic() - killed
        stopping = time.monotonic()
        process.send_signal(signal.SIGTERM)
        process.wait(120)
        shutdown = time.monotonic() - stopping
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return {"startup_s": startup, "warmup_s": warmup, "restart_s": restart, "shutdown_s": shutdown}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--model", help="GGUF file (default: the bundled model)")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.runs):
            runs.append(one_run(args.model, Path(tmp) / "serve.log"))
            print(f"run {n + 1}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[-1].items()), flush=True)
    summary = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    print("median: " + ", ".join(f"{k} {v:.2f}" for k, v in summary.items()))
    out = ROOT / "bench" / "results" / "engine_startup.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"runs": runs, "median": summary, "cpus": os.cpu_count()}, indent=2) + "\n")


if __name__ == "__main__":
    main()
