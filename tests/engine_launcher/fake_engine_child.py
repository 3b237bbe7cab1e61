"""A stand-in engine process for supervisor tests: a real process and real HTTP, with scripted behaviour.

``python tests/engine_launcher/fake_engine_child.py PORT MODE`` where MODE is one of:

- ``serve``: print a few lines, then answer ``GET /docs`` with 200 forever;
- ``exit``: print a few lines, then exit with status 3 without listening;
- ``hang``: print a line and never listen (a start that does not finish);
- ``stubborn``: like ``serve``, but ignore SIGTERM;
- ``SIGSEGV``, ``SIGILL``, ...: like ``serve``, but a ``POST`` (a generation) kills it with that signal;
  ``SIGSEGV-amx`` first prints llama.cpp's line for weights loaded into its AMX buffer;
- ``refuse``: like ``serve``, but a ``POST`` answers 500.
"""

from __future__ import annotations

import http.server
import os
import signal
import sys
import threading


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/docs" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        mode = self.server.mode  # type: ignore[attr-defined]
        if mode.startswith("SIG"):
            print("fake engine: computing the first batch", flush=True)
            os.kill(os.getpid(), signal.Signals[mode.split("-")[0]])
        body = b'{"error": {"message": "no generation here"}}' if mode == "refuse" else b"{}"
        self.send_response(500 if mode == "refuse" else 200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        print("fake engine: " + format % args, flush=True)


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    print("fake engine: loading model", flush=True)
    if mode == "exit":
        print("fake engine: error: the model file is corrupt", flush=True)
        sys.exit(3)
    if mode == "hang":
        threading.Event().wait()
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if mode.endswith("-amx"):
        print("load_tensors:          AMX model buffer size =   213.91 MiB", flush=True)
    server = http.server.HTTPServer(("127.0.0.1", port), _Handler)
    server.mode = mode  # type: ignore[attr-defined]
    print(f"fake engine: listening on {port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
