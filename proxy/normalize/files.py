"""Where ``toolpair normalize`` writes: stdout, or a file that appears only when the run succeeds.

A file is written beside its target under a temporary name and renamed over it
at the end, so a failed run leaves no half-written file and ``-o IN`` rewrites a
file in place. A target ending in ``.gz`` is gzip-compressed (JSONL only).

Errors::

    NormalizeFailed    raised when the input cannot be read or the output cannot be written
"""

from __future__ import annotations

import contextlib
import gzip
import os
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

__all__ = ["GZIP_LEVEL", "NormalizeFailed", "Output"]

WRITE_SIZE = 1 << 20
GZIP_LEVEL = 1  # zlib level 1 writes about 100 MB/s; level 6 (gzip's default) about 17 MB/s, for a 25% smaller file


class NormalizeFailed(Exception):
    """Raised when the input cannot be read or the output cannot be written."""


class Output:
    """Stdout, or a temporary file beside the target that ``commit`` renames over it."""

    def __init__(self, name: str | None, stdout: BinaryIO, *, compress: bool = True) -> None:
        self.name = "stdout" if name in (None, "-") else str(name)
        self._temp: Path | None = None
        self._target: Path | None = None
        if name in (None, "-"):
            self.file = stdout
        else:
            target = Path(name)
            if target.exists() and not target.is_file():  # a FIFO or a device: write straight to it
                self.file = open(target, "wb", buffering=WRITE_SIZE)  # noqa: SIM115
            else:
                fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                self.file = os.fdopen(fd, "wb", buffering=WRITE_SIZE)
                self._temp, self._target = Path(temp), target
        self.stream: BinaryIO | gzip.GzipFile = self.file
        if compress and name is not None and name != "-" and name.endswith(".gz"):
            # mtime 0 and the target's own name: the same input gives the same bytes.
            self.stream = gzip.GzipFile(
                filename=Path(name).name, mode="wb", fileobj=self.file, compresslevel=GZIP_LEVEL, mtime=0
            )

    @classmethod
    def open(cls, name: str | None, stdout: BinaryIO, *, compress: bool = True) -> Output:
        """An Output, or NormalizeFailed saying why it cannot be created."""
        try:
            return cls(name, stdout, compress=compress)
        except OSError as exc:
            raise NormalizeFailed(f"cannot write {name}: {exc.strerror or exc}") from None

    def write(self, data: bytes | memoryview) -> None:
        try:
            self.stream.write(data)
        except BrokenPipeError:
            raise  # the reader went away (`| head`): the caller ends quietly
        except OSError as exc:
            raise NormalizeFailed(f"cannot write {self.name}: {exc}") from None

    def commit(self) -> None:
        """Finish the output: flush it, and rename a temporary file over its target."""
        try:
            if self.stream is not self.file:
                self.stream.close()
            self.file.flush()
            if self._temp is None or self._target is None:
                return
            self.file.close()
            os.chmod(self._temp, _mode_for(self._target))
            os.replace(self._temp, self._target)
            self._temp = None
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise NormalizeFailed(f"cannot write {self.name}: {exc}") from None

    def abort(self) -> None:
        """Remove a temporary file that was not committed; nothing once committed."""
        if self._temp is None:
            return
        with contextlib.suppress(OSError):
            self.file.close()
        self._temp.unlink(missing_ok=True)
        self._temp = None


def _mode_for(target: Path) -> int:
    """Keep an existing file's permissions; a new one gets what open() would give it."""
    try:
        return stat.S_IMODE(target.stat().st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
