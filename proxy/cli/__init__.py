"""The ``toolpair`` command line: a module per command, put together in :mod:`proxy.cli.parser`.

Each command's module adds its own subparser (``add_parser``) and runs it (``run``); the flags and
helpers more than one command uses live in :mod:`proxy.cli.common`.
"""

from proxy.cli.parser import build_parser, main

__all__ = ["build_parser", "main"]
