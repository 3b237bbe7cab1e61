"""The ``toolpair`` parser, put together from each command's module, and ``main``, which runs the one chosen."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import proxy.cli.check_template as check_template
import proxy.cli.engine as engine
import proxy.cli.normalize as normalize
import proxy.cli.proxy as sidecar
import proxy.cli.rpc_worker as rpc_worker
import proxy.cli.serve as serve
from proxy import __version__
from proxy.config import ConfigError

__all__ = ["build_parser", "main"]

DESCRIPTION = """\
toolpair puts parallel tool results back into call order before a request
reaches the model, so chat templates that render results by position pair each
result with the right call.

commands:
  proxy      run as a sidecar in front of an OpenAI-compatible engine you already run
             (Chat Completions, Anthropic Messages and Responses)
  serve      run llama-cpp-python for you (the bundled model by default), with toolpair in front
  engine     build and install llama-cpp-python for this machine (engine install), or show
             which backend this machine would get (engine detect)
  normalize  put tool results in JSONL or Parquet datasets into call order, with the proxy's rules
  rpc-worker run a llama.cpp RPC worker that `serve --rpc` splits a model across
  check-template  say whether a model's chat template ties tool results to their calls by
             position only (toolpair needed) or by ID
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toolpair", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"toolpair {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (sidecar, normalize, serve, rpc_worker, check_template, engine):  # the order --help lists
        command.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "run", None) is None:
        parser.print_help()
        return 2
    try:
        code: int = args.run(args)
    except ConfigError as exc:
        print(f"toolpair: {exc}", file=sys.stderr)
        return 2
    return code
