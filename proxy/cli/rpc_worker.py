"""``toolpair rpc-worker``: llama.cpp's rpc-server, built against this engine, for ``serve --rpc`` elsewhere."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from engine_launcher.builder.install import rpc_server_command
from engine_launcher.builder.machine import this_machine
from engine_launcher.builder.plan import EngineSettings, plan_engine
from engine_launcher.builder.record import read_record
from engine_launcher.inside.rpc import DEFAULT_PORT, WILDCARD_HOSTS
from engine_launcher.supervise.launch import child_env
from proxy.cli.common import Subcommands, positive

__all__ = ["add_parser"]


def add_parser(commands: Subcommands) -> None:
    worker = commands.add_parser(
        "rpc-worker",
        help="run a llama.cpp RPC worker that `serve --rpc` splits a model across",
        description=(
            "Run llama.cpp's rpc-server, built by `toolpair engine install` against this engine, so that "
            "`toolpair serve --rpc HOST:PORT,...` on another machine can put model layers on this one. "
            "RPC has no authentication and no encryption: listen only on a private network that only the "
            "serving machine can reach."
        ),
    )
    worker.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    worker.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port to listen on (default {DEFAULT_PORT})")
    worker.add_argument("--threads", type=positive, metavar="N", help="CPU threads (default: the CPU's cores)")
    worker.add_argument(
        "--cache", action="store_true", help="keep received tensors in a local cache, for faster reloads"
    )
    worker.add_argument(
        "--allow-all-interfaces",
        action="store_true",
        help="allow --host 0.0.0.0 or :: (e.g. inside a container whose published port decides who can reach it)",
    )
    worker.set_defaults(run=_run_rpc_worker)


def _run_rpc_worker(args: argparse.Namespace) -> int:
    if args.host.strip() in WILDCARD_HOSTS and not args.allow_all_interfaces:
        print(
            f"toolpair rpc-worker: refusing --host {args.host!r}: RPC has no authentication, and this listens on "
            "every interface. Give the private address to listen on, or add --allow-all-interfaces where "
            "something else (a container's published port, a firewall) decides who can connect.",
            file=sys.stderr,
        )
        return 2
    record = read_record()
    server = record.rpc_server if record else None
    if not server or not os.access(server, os.X_OK):
        print(
            "toolpair rpc-worker: rpc-server is not installed in this environment: run `toolpair engine install` "
            "(it builds the engine with RPC, and rpc-server against it)",
            file=sys.stderr,
        )
        return 1
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"toolpair rpc-worker: listening on {args.host}:{args.port} without authentication; "
            "only the serving machine may be able to reach it",
            file=sys.stderr,
        )
    assert record is not None
    # The worker offers the devices serve's engine would use, with the same environment: serve's plan.
    engine = plan_engine(EngineSettings(), this_machine(), record, os.environ)
    devices = engine.devices
    if engine.refusal is not None:  # as serve: rpc-server would fail too
        print(f"toolpair rpc-worker: {engine.refusal}", file=sys.stderr)
        return 2
    if devices is not None and devices.problem:
        print(f"toolpair rpc-worker: warning: {devices.problem}", file=sys.stderr)
    elif devices is not None and devices.names:
        note = f" ({devices.note})" if devices.note else ""
        print(f"toolpair rpc-worker: device: {', '.join(devices.names)}{note}", file=sys.stderr)
    print(f"toolpair rpc-worker: {server} on {args.host}:{args.port}", file=sys.stderr, flush=True)
    command = rpc_server_command(server, args.host, args.port, threads=args.threads, cache=args.cache)
    # rpc-server says its endpoint and devices through stdio, which a pipe or a file (a journal, `docker
    # logs`) would hold back until 4 KiB gathered: line-buffered, where coreutils' stdbuf is there.
    stdbuf = shutil.which("stdbuf")
    if stdbuf is not None:
        command = [stdbuf, "-oL", *command]
    os.execve(command[0], command, child_env(os.environ, engine.env))
