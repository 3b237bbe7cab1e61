"""Files and streams for ``toolpair normalize``: read, normalize block by block, write, report.

The rules live in ``proxy.normalize`` (pure); this module only moves bytes:

- Input is a path or ``-`` (stdin), gzip or not (told by its first two bytes).
- It is read in blocks of whole lines, so memory stays constant in the file
  size (it grows only with the longest line).
- Output goes to stdout or ``-o OUT`` (gzip when OUT ends in ``.gz``). A file is
  written beside OUT under a temporary name and renamed over it at the end, so a
  failed run leaves no half-written file and ``-o IN`` rewrites a file in place.
- With ``workers > 1`` blocks go to a process pool; at most two blocks per
  worker are in flight, and results are written in input order.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import multiprocessing
import os
import stat
import sys
import tempfile
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TextIO

from proxy.normalize import Edit, NormalizeTally, WholeLines, apply_edits, block_edits, normalize_block
from proxy.ops.progress import Progress

__all__ = ["NormalizeFailed", "NormalizeJob", "run_normalize"]

READ_SIZE = 1 << 20
WORKER_BLOCK = 4 << 20  # fewer, larger tasks keep the pool's per-task overhead small
GZIP_MAGIC = b"\x1f\x8b"
GZIP_LEVEL = 1  # zlib level 1 writes about 100 MB/s; level 6 (gzip's default) about 17 MB/s, for a 25% smaller file


class NormalizeFailed(Exception):
    """Raised when the input cannot be read or the output cannot be written."""


@dataclass(frozen=True)
class NormalizeJob:
    """One ``toolpair normalize`` run, as the command line asked for it."""

    source: str  # a path, or "-" for stdin
    output: str | None = None  # a path; None or "-" is stdout
    check: bool = False  # write nothing; exit 1 if any record would change
    report: str | None = None  # where to write the JSON report
    workers: int = 1
    validate: bool = False  # parse lines without ID markers too, to count bad ones
    progress: bool | None = None  # None: only when stderr is a terminal
    block_size: int | None = None  # bytes read at a time; None: 1 MiB, or 4 MiB per worker task


class _Source:
    """The input file (or stdin), decompressed when it starts with the gzip magic bytes."""

    def __init__(self, name: str, stdin: BinaryIO) -> None:
        self.name = "stdin" if name == "-" else name
        self.file: BinaryIO = stdin if name == "-" else open(name, "rb", buffering=READ_SIZE)  # noqa: SIM115
        self.size: int | None = None
        try:
            info = os.fstat(self.file.fileno())
            if stat.S_ISREG(info.st_mode):
                self.size = info.st_size
        except (OSError, ValueError, AttributeError):
            pass
        peek = getattr(self.file, "peek", None)
        magic = peek(2)[:2] if peek is not None else b""
        self.stream: BinaryIO | gzip.GzipFile = self.file
        if magic == GZIP_MAGIC:
            self.stream = gzip.GzipFile(fileobj=self.file, mode="rb")
        # A plain named file can be read by worker processes themselves, by offset.
        self.identity: tuple[str, int, int] | None = None
        if self.size is not None and name != "-" and self.stream is self.file:
            info = os.fstat(self.file.fileno())
            self.identity = (os.path.abspath(name), info.st_dev, info.st_ino)

    def fraction(self) -> float | None:
        """How far through the (compressed) file reading is, when its size is known."""
        if not self.size:
            return None
        try:
            return self.file.tell() / self.size
        except OSError:
            return None

    def blocks(self, size: int) -> Iterator[bytes]:
        cut = WholeLines()
        while chunk := self._read(size):
            yield from cut.feed(chunk)
        yield from cut.finish()

    def _read(self, size: int) -> bytes:
        try:
            return self.stream.read(size)
        except (OSError, EOFError, zlib.error) as exc:  # also a truncated or corrupt gzip stream
            raise NormalizeFailed(f"cannot read {self.name}: {exc}") from None

    def close(self) -> None:
        if self.stream is not self.file:
            self.stream.close()
        if self.name != "stdin":
            self.file.close()


class _Sink:
    """Stdout, or a temporary file beside the target that ``commit`` renames over it."""

    def __init__(self, name: str | None, stdout: BinaryIO) -> None:
        self.name = "stdout" if name in (None, "-") else str(name)
        self._temp: Path | None = None
        self._target: Path | None = None
        if name in (None, "-"):
            self.file = stdout
        else:
            target = Path(name)
            if target.exists() and not target.is_file():  # a FIFO or a device: write straight to it
                self.file = open(target, "wb", buffering=READ_SIZE)  # noqa: SIM115
            else:
                fd, temp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
                self.file = os.fdopen(fd, "wb", buffering=READ_SIZE)
                self._temp, self._target = Path(temp), target
        self.stream: BinaryIO | gzip.GzipFile = self.file
        if name is not None and name != "-" and name.endswith(".gz"):
            # mtime 0 and the target's own name: the same input gives the same bytes.
            self.stream = gzip.GzipFile(
                filename=Path(name).name, mode="wb", fileobj=self.file, compresslevel=GZIP_LEVEL, mtime=0
            )

    def write(self, data: bytes) -> None:
        self.stream.write(data)

    def commit(self) -> None:
        if self.stream is not self.file:
            self.stream.close()
        self.file.flush()
        if self._temp is None or self._target is None:
            return
        self.file.close()
        os.chmod(self._temp, _mode_for(self._target))
        os.replace(self._temp, self._target)
        self._temp = None

    def abort(self) -> None:
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


def _count_lines(block: bytes) -> int:
    return block.count(b"\n") + (0 if block.endswith(b"\n") else 1)


def _quiet_worker() -> None:
    gc.disable()  # parsed records hold no cycles; the collector would only walk them


@dataclass(frozen=True)
class _FileSlice:
    """Where a block lies in the input file: what a worker is sent instead of the bytes."""

    path: str
    device: int
    inode: int
    offset: int
    length: int


_worker_files: dict[str, int] = {}  # in a worker process: the input file, opened once


def _slice_edits(part: _FileSlice, first_line: int, validate: bool) -> tuple[list[Edit], NormalizeTally]:
    """In a worker: read the block from the file itself, so the data never crosses a pipe."""
    fd = _worker_files.get(part.path)
    if fd is None:
        fd = os.open(part.path, os.O_RDONLY)
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (part.device, part.inode):
            os.close(fd)
            raise NormalizeFailed(f"{part.path} was replaced while it was being read")
        _worker_files[part.path] = fd
    pieces = []
    done = 0
    while done < part.length:
        piece = os.pread(fd, part.length - done, part.offset + done)
        if not piece:
            raise NormalizeFailed(f"{part.path} shrank while it was being read")
        pieces.append(piece)
        done += len(piece)
    block = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    return block_edits(block, first_line, validate=validate)


class _Run:
    """The state of one run: the tally so far, the output, the progress line."""

    def __init__(self, job: NormalizeJob, source: _Source, sink: _Sink | None, progress: Progress | None) -> None:
        self.job = job
        self.source = source
        self.sink = sink
        self.progress = progress
        self.tally = NormalizeTally()
        self.done_bytes = 0

    def emit(self, block_in: int, out: bytes, part: NormalizeTally) -> None:
        self.tally.merge(part)
        self.done_bytes += block_in
        if self.sink is not None:
            try:
                self.sink.write(out)
            except BrokenPipeError:
                raise  # the reader went away (`| head`): the caller ends quietly
            except OSError as exc:
                raise NormalizeFailed(f"cannot write {self.sink.name}: {exc}") from None
        if self.progress is not None:
            self.progress.update(self.tally.lines, self.done_bytes, self.source.fraction())

    def in_process(self) -> None:
        line = 1
        for block in self.source.blocks(self.job.block_size or READ_SIZE):
            out, part = normalize_block(block, line, validate=self.job.validate)
            line += part.lines
            self.emit(len(block), out, part)

    def in_pool(self) -> None:
        workers = self.job.workers
        context = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
        # Each worker sends back only the lines that changed; this process keeps the
        # block and splices them in. From a plain file, workers read their blocks
        # themselves; otherwise (stdin, gzip) the block is sent to them.
        identity = self.source.identity
        validate = self.job.validate
        pending: deque[tuple[bytes, Future[tuple[list[Edit], NormalizeTally]]]] = deque()
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_quiet_worker) as pool:
            line, offset = 1, 0
            for block in self.source.blocks(self.job.block_size or WORKER_BLOCK):
                if identity is not None:
                    part = _FileSlice(*identity, offset, len(block))
                    pending.append((block, pool.submit(_slice_edits, part, line, validate)))
                else:
                    pending.append((block, pool.submit(block_edits, block, line, validate=validate)))
                line += _count_lines(block)
                offset += len(block)
                if len(pending) >= 2 * workers:
                    self._splice(*pending.popleft())
            while pending:
                self._splice(*pending.popleft())

    def _splice(self, block: bytes, future: Future[tuple[list[Edit], NormalizeTally]]) -> None:
        edits, part = future.result()
        self.emit(len(block), apply_edits(block, edits), part)


def _open_source(name: str, stdin: BinaryIO) -> _Source:
    try:
        return _Source(name, stdin)
    except OSError as exc:
        raise NormalizeFailed(f"cannot read {name}: {exc.strerror or exc}") from None


def _open_sink(name: str | None, stdout: BinaryIO) -> _Sink:
    try:
        return _Sink(name, stdout)
    except OSError as exc:
        raise NormalizeFailed(f"cannot write {name}: {exc.strerror or exc}") from None


def _write_report(job: NormalizeJob, tally: NormalizeTally) -> None:
    if job.report is None:
        return
    document = {"input": job.source, "check": job.check, **tally.as_report()}
    try:
        Path(job.report).write_text(json.dumps(document, indent=2) + "\n")
    except OSError as exc:
        raise NormalizeFailed(f"cannot write report {job.report}: {exc.strerror or exc}") from None


def _summarize(job: NormalizeJob, tally: NormalizeTally, stderr: TextIO) -> None:
    if tally.bad:
        stderr.write(
            f"toolpair normalize: {tally.bad:,} bad line(s) copied through unchanged "
            f"(first at line {tally.bad_lines[0]})\n"
        )
    if job.check and tally.changed:
        lines = ", ".join(str(n) for n in tally.changed_lines[:10])
        more = ", ..." if tally.changed > 10 else ""
        stderr.write(
            f"toolpair normalize: {tally.changed:,} of {tally.records:,} records would change (lines {lines}{more})\n"
        )


def run_normalize(
    job: NormalizeJob,
    *,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Carry out one run and return the exit status: 0, or 1 when ``check`` finds changes.

    Raises NormalizeFailed when a file cannot be read or written.
    """
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout.buffer
    stderr = stderr if stderr is not None else sys.stderr
    show = job.progress if job.progress is not None else stderr.isatty()
    source = _open_source(job.source, stdin)
    sink: _Sink | None = None
    collecting = gc.isenabled()
    gc.disable()  # parsed records hold no cycles; the collector would only walk them
    try:
        sink = None if job.check else _open_sink(job.output, stdout)
        run = _Run(job, source, sink, Progress(stderr) if show else None)
        try:
            if job.workers > 1:
                run.in_pool()
            else:
                run.in_process()
        except BrokenProcessPool:
            raise NormalizeFailed("a worker process died; try fewer --workers") from None
        if run.progress is not None:
            run.progress.done(run.tally.lines, run.done_bytes, 1.0 if source.size else None)
        if sink is not None:
            try:
                sink.commit()
            except BrokenPipeError:
                raise
            except OSError as exc:
                raise NormalizeFailed(f"cannot write {sink.name}: {exc}") from None
        _write_report(job, run.tally)
        _summarize(job, run.tally, stderr)
        return 1 if job.check and run.tally.changed else 0
    finally:
        if collecting:
            gc.enable()
        if sink is not None:
            sink.abort()
        source.close()
