"""``toolpair normalize`` inside the full command line (``python -m proxy normalize`` skips to it directly)."""

from __future__ import annotations

import argparse

from proxy.cli.common import Subcommands
from proxy.normalize import cli as normalize_cli

__all__ = ["add_parser"]


def add_parser(commands: Subcommands) -> None:
    normalize = commands.add_parser("normalize", help=normalize_cli.HELP, description=normalize_cli.DESCRIPTION)
    normalize_cli.add_arguments(normalize)
    normalize.set_defaults(run=_run_normalize)


def _run_normalize(args: argparse.Namespace) -> int:
    return normalize_cli.run_args(args)
