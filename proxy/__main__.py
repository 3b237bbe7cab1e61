"""``python -m proxy`` and the ``toolpair`` command.

``toolpair normalize`` goes straight to its own module: the rest of the command
line loads the HTTP server, which would cost a dataset run about half a second.
"""

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["normalize"]:
        from proxy.normalize.cli import main as normalize

        return normalize(args[1:])
    from proxy.cli import main as everything

    return everything(args)


if __name__ == "__main__":
    sys.exit(main())
