"""JSONL files for ``toolpair normalize``: blocks of whole lines in, the same lines out.

The per-line rules are in ``core``; this module cuts a byte stream into blocks
of whole lines, normalizes a block, and drives a run over a file:

- Input is a path or ``-`` (stdin), gzip or not (told by its first two bytes).
- A plain file is cut into planned slices of whole lines (``plan_slices``
  reads only a small window at each cut) and each slice is read with
  ``pread``; stdin and gzip are cut into blocks as they are read. Either way
  memory stays constant in the file size (it grows only with the longest line).
- With ``workers > 1`` slices go to a process pool (``pool``); at most two per
  worker are in flight, and results are written in input order. From a plain
  file a worker reads its slice itself, numbers its lines from 1 and sends back
  only the lines that changed; this process shifts the numbers as results
  arrive and reads a slice only to write it out.

A block is scanned line by line for the ID markers; only a line that may hold
one (``core.may_hold_results``) is parsed. Any other line costs a byte search
or two and a counter: no parse, no result object, no copy. That is what keeps
short-record datasets (half of them plain turns) at the speed of long ones.
"""

from __future__ import annotations

import gzip
import itertools
import os
import stat
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from proxy.normalize.core import (
    NormalizeTally,
    may_hold_results,
    native_scan_block,
    normalize_line,
    normalize_marked_line,
    quick_marked_line,
)
from proxy.normalize.files import NormalizeFailed
from proxy.normalize.pool import worker_pool

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = [
    "Edit",
    "JsonlSource",
    "WholeLines",
    "apply_edits",
    "block_edits",
    "edited_pieces",
    "normalize_block",
    "normalize_jsonl",
    "plan_slices",
    "read_slice",
]

READ_SIZE = 1 << 20
WORKER_BLOCK = 4 << 20  # fewer, larger tasks keep the pool's per-task overhead small
GZIP_MAGIC = b"\x1f\x8b"

Edit = tuple[int, int, bytes]
"""Replace ``block[start:end]`` (one line, without its ``\\n``) with these bytes."""


def block_edits(block: bytes, first_line: int = 1, *, validate: bool = False) -> tuple[list[Edit], NormalizeTally]:
    """Normalize a block of whole lines and say only which lines changed, and how.

    A worker process sends back these few edits instead of the whole block.

    >>> import orjson
    >>> calls = [{"type": "function_call", "call_id": i} for i in "ab"]
    >>> outputs = [{"type": "function_call_output", "call_id": i} for i in "ba"]
    >>> block = b'{"a": 1}\\n' + orjson.dumps({"input": calls + outputs}) + b'\\n'
    >>> edits, tally = block_edits(block, first_line=10)
    >>> [(start, end) for start, end, _ in edits], tally.changed_lines
    ([(9, 190)], [11])
    """
    tally = NormalizeTally()
    edits: list[Edit] = []
    if not block:
        return edits, tally
    lines = block.split(b"\n")
    if not lines[-1]:  # the block ends with "\n": the empty tail is not a line
        lines.pop()
    add = tally.add
    start = 0
    if validate:
        for number, line in enumerate(lines, first_line):
            fresh, result = normalize_line(line, validate=True)
            if fresh is not line:
                edits.append((start, start + len(line), fresh))
            add(number, result)
            start += len(line) + 1
        return edits, tally
    if native_scan_block is not None:
        return _native_block_edits(block, first_line)
    starts = itertools.accumulate((len(line) + 1 for line in lines), initial=0)
    _python_lines(zip(starts, lines, itertools.count(first_line)), tally, edits)
    return edits, tally


def _python_lines(items: Iterable[tuple[int, bytes, int]], tally: NormalizeTally, edits: list[Edit]) -> None:
    """The block loop in Python over (start, line, number): every line, or those the native scan left.

    The same as ``normalize_line`` line by line, with the unparsed lines only
    counted and the common marked line (``quick_marked_line``) counted here,
    without a result object or a call per count. Every marker holds "_" and
    every escape a backslash: one memchr each rules most plain turns out.
    """
    unparsed = blank = parsed = changed = reordered = in_order = 0
    changed_lines = tally.changed_lines
    room = tally.max_line_numbers
    add = tally.add
    for start, line, number in items:
        if (b"_" in line or b"\\" in line) and may_hold_results(line):
            quick = quick_marked_line(line)
            if quick is None:
                fresh, result = normalize_marked_line(line)
                add(number, result)
                if fresh is not line:
                    edits.append((start, start + len(line), fresh))
                continue
            fresh, moved, kept_order = quick
            parsed += 1
            reordered += moved
            in_order += kept_order
            if fresh is not line:
                changed += 1
                if len(changed_lines) < room:
                    changed_lines.append(number)
                edits.append((start, start + len(line), fresh))
        elif not line or line.isspace():
            blank += 1
        else:
            unparsed += 1
    tally.lines += unparsed + blank + parsed
    tally.records += unparsed + parsed
    tally.blank += blank
    tally.changed += changed
    tally.runs_reordered += reordered
    tally.runs_in_order += in_order


def _native_block_edits(block: bytes, first_line: int) -> tuple[list[Edit], NormalizeTally]:
    """``block_edits`` with the native scan over every line, and the Python path for the lines it left.

    The scan counts the lines it answers (and those it need not read) and
    returns those that moved; the rest, which it did not answer, go through
    ``_python_lines`` and are merged back in line order.
    """
    assert native_scan_block is not None
    tally = NormalizeTally()
    found, answered, reordered, in_order, blank, unparsed, rest = native_scan_block(block)
    edits: list[Edit] = [(start, end, fresh) for start, end, fresh, _ in found]
    room = tally.max_line_numbers
    numbers = [first_line + index for _, _, _, index in found[:room]]
    if rest:
        _python_lines(((start, block[start:end], first_line + index) for start, end, index in rest), tally, edits)
        edits.sort()  # by start: no two lines start at the same byte
        if tally.changed_lines:  # each list holds its first ``room``: the first ``room`` of both are among them
            numbers = sorted(numbers + tally.changed_lines)[:room]
    tally.changed_lines = numbers
    tally.lines += answered + blank + unparsed
    tally.records += answered + unparsed
    tally.blank += blank
    tally.changed += len(found)
    tally.runs_reordered += reordered
    tally.runs_in_order += in_order
    return edits, tally


JOIN_EDITS = 32
"""Above this many changed lines in a block, its pieces are joined and written as one.

Each piece costs a call to write (about a microsecond with its checks), and
joining costs a copy of the block (tens of microseconds per MiB): a few edits
are cheaper written as pieces, a block where every other line moved as one.
"""


def edited_pieces(block: bytes, edits: list[Edit]) -> list[bytes | memoryview]:
    """The block as pieces to write one after another: views of the kept bytes, and the edited lines.

    Writing the pieces saves joining a copy of the whole block first, unless
    there are more than ``JOIN_EDITS`` of them; then they come joined, as one.

    >>> [bytes(piece) for piece in edited_pieces(b"a\\nbb\\nc", [(2, 4, b"B")])]
    [b'a\\n', b'B', b'\\nc']
    >>> edited_pieces(b"a\\n" * 40, [(2 * i, 2 * i + 1, b"A") for i in range(40)]) == [b"A\\n" * 40]
    True
    """
    if not edits:
        return [block]
    view = memoryview(block)
    parts: list[bytes | memoryview] = []
    position = 0
    for start, end, fresh in edits:
        parts.append(view[position:start])
        parts.append(fresh)
        position = end
    parts.append(view[position:])
    if len(edits) > JOIN_EDITS:
        return [b"".join(parts)]
    return parts


def apply_edits(block: bytes, edits: list[Edit]) -> bytes:
    """The block with each edited line replaced; the block itself when there are none.

    >>> apply_edits(b"a\\nbb\\nc", [(2, 4, b"B")])
    b'a\\nB\\nc'
    """
    return b"".join(edited_pieces(block, edits)) if edits else block


def normalize_block(block: bytes, first_line: int = 1, *, validate: bool = False) -> tuple[bytes, NormalizeTally]:
    """Normalize a block of whole lines; the last may lack its ``\\n``, which stays missing.

    >>> out, tally = normalize_block(b'{"a": 1}\\n\\nnot json, but no markers\\n{"call_id": ')
    >>> out == b'{"a": 1}\\n\\nnot json, but no markers\\n{"call_id": '
    True
    >>> tally.lines, tally.records, tally.blank, tally.bad, tally.bad_lines
    (4, 2, 1, 1, [4])
    """
    edits, tally = block_edits(block, first_line, validate=validate)
    return apply_edits(block, edits), tally


class WholeLines:
    """Cut a byte stream into blocks of whole lines: ``feed(chunk) -> list``, ``finish() -> list``.

    Every block but the last ends with ``\\n``; a last line without one is
    returned by ``finish`` exactly as it came. Joining the blocks gives the input.

    >>> cut = WholeLines()
    >>> cut.feed(b"a\\nb"), cut.feed(b"c\\nd"), cut.finish()
    ([b'a\\n'], [b'bc\\n'], [b'd'])
    """

    def __init__(self) -> None:
        self._tail: list[bytes] = []  # pieces of an unfinished line; a list keeps long lines linear

    def feed(self, chunk: bytes) -> list[bytes]:
        end = chunk.rfind(b"\n")
        if end < 0:
            if chunk:
                self._tail.append(chunk)
            return []
        if self._tail:  # one copy: the tail and a view of the head joined
            block = b"".join([*self._tail, memoryview(chunk)[: end + 1]])
        else:
            block = chunk if end + 1 == len(chunk) else chunk[: end + 1]
        rest = chunk[end + 1 :]
        self._tail = [rest] if rest else []
        return [block]

    def finish(self) -> list[bytes]:
        tail, self._tail = b"".join(self._tail), []
        return [tail] if tail else []


# --- reading a file ---------------------------------------------------------


class JsonlSource:
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
        self.position: int | None = None  # bytes done, when blocks are read by offset rather than in turn
        if self.size is not None and name != "-" and self.stream is self.file:
            info = os.fstat(self.file.fileno())
            self.identity = (os.path.abspath(name), info.st_dev, info.st_ino)

    def fraction(self) -> float | None:
        """How far through the (compressed) file reading is, when its size is known."""
        if not self.size:
            return None
        if self.position is not None:
            return self.position / self.size
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


def _count_lines(block: bytes) -> int:
    return block.count(b"\n") + (0 if block.endswith(b"\n") else 1)


PROBE_SIZE = 64 << 10  # bytes read at a planned cut to find the end of its line


def plan_slices(fd: int, size: int, block_size: int) -> Iterator[tuple[int, int]]:
    """Cut a file of ``size`` bytes into ``(offset, length)`` slices of whole lines.

    Each slice ends just after the first ``\\n`` at or past ``block_size`` bytes
    (the last one at the end of the file, with or without its ``\\n``). Only a
    small window at each cut is read, so the process that plans never holds the
    data; the slices are read by whoever normalizes them.
    """
    offset = 0
    while offset < size:
        cut = offset + max(block_size, 1) - 1  # the slice's last byte if a line ends there
        while cut < size:
            window = os.pread(fd, PROBE_SIZE, cut)
            if not window:
                cut = size
                break
            newline = window.find(b"\n")
            if newline >= 0:
                cut += newline + 1
                break
            cut += len(window)
        end = min(cut, size)
        yield offset, end - offset
        offset = end


@dataclass(frozen=True)
class _FileSlice:
    """Where a block lies in the input file: what a worker is sent instead of the bytes."""

    path: str
    device: int
    inode: int
    offset: int
    length: int


_worker_files: dict[str, int] = {}  # in a worker process: the input file, opened once


def read_slice(fd: int, offset: int, length: int, name: str) -> bytes:
    """``length`` bytes at ``offset``, or NormalizeFailed if the file is shorter now."""
    pieces = []
    done = 0
    while done < length:
        piece = os.pread(fd, length - done, offset + done)
        if not piece:
            raise NormalizeFailed(f"{name} shrank while it was being read")
        pieces.append(piece)
        done += len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


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
    block = read_slice(fd, part.offset, part.length, part.path)
    return _worker_edits(block, first_line, validate)


def _worker_edits(block: bytes, first_line: int, validate: bool) -> tuple[list[Edit], NormalizeTally]:
    """In a worker: the block's edits, as one edit of the whole block when there are many.

    Sending a block where every other line moved as one bytes object costs a
    copy; sending its edits costs pickling a tuple per line, here and back.
    """
    edits, tally = block_edits(block, first_line, validate=validate)
    if len(edits) > JOIN_EDITS:
        edits = [(0, len(block), apply_edits(block, edits))]
    return edits, tally


Emit = Callable[[int, list[bytes | memoryview], NormalizeTally], None]
"""Called once per block, in input order: bytes read, the pieces to write, the block's tally."""


def normalize_jsonl(
    source: JsonlSource,
    emit: Emit,
    *,
    workers: int = 1,
    validate: bool = False,
    block_size: int | None = None,
    write: bool = True,
) -> None:
    """Normalize every block of ``source`` and hand each result to ``emit``, in input order.

    Without ``write`` (``--check``) nothing is written, so ``emit`` gets no
    pieces and the process that coordinates workers never reads the data.
    """
    if source.identity is not None and source.size is not None:
        _normalize_file(source, emit, source.size, workers, validate, block_size, write)
        return
    if workers <= 1:
        line = 1
        for block in source.blocks(block_size or READ_SIZE):
            edits, part = block_edits(block, line, validate=validate)
            line += part.lines
            emit(len(block), edited_pieces(block, edits), part)
        return
    # Stdin or gzip: the block goes to a worker, which sends back only the lines
    # that changed; this process keeps the block and splices them in.
    pending: deque[tuple[bytes, Future[tuple[list[Edit], NormalizeTally]]]] = deque()

    def splice() -> None:
        block, future = pending.popleft()
        edits, part = future.result()
        emit(len(block), edited_pieces(block, edits) if write else [], part)

    with worker_pool(workers) as pool:
        line = 1
        for block in source.blocks(block_size or WORKER_BLOCK):
            pending.append((block, pool.submit(_worker_edits, block, line, validate)))
            line += _count_lines(block)
            if len(pending) >= 2 * workers:
                splice()
        while pending:
            splice()


def _normalize_file(
    source: JsonlSource, emit: Emit, size: int, workers: int, validate: bool, block_size: int | None, write: bool
) -> None:
    """A plain file: planned slices read with ``pread``, by the workers when there are several.

    Workers number lines from 1 within their slice; this process, which learns
    each slice's line count only from its result, shifts the numbers as results
    arrive in order. It reads a slice's bytes only to write them out.
    """
    fd = source.file.fileno()
    name = source.name
    if workers <= 1:
        line = 1
        for offset, length in plan_slices(fd, size, block_size or READ_SIZE):
            block = read_slice(fd, offset, length, name)
            edits, part = block_edits(block, line, validate=validate)
            line += part.lines
            source.position = offset + length
            emit(length, edited_pieces(block, edits) if write else [], part)
        return
    assert source.identity is not None
    path, device, inode = source.identity
    pending: deque[tuple[int, int, Future[tuple[list[Edit], NormalizeTally]]]] = deque()
    line = 1

    def splice() -> None:
        nonlocal line
        offset, length, future = pending.popleft()
        edits, part = future.result()
        part.renumber(line - 1)
        line += part.lines
        source.position = offset + length
        if not write:
            pieces: list[bytes | memoryview] = []
        elif len(edits) == 1 and edits[0][:2] == (0, length):  # the whole slice, from _worker_edits
            pieces = [edits[0][2]]
        else:
            pieces = edited_pieces(read_slice(fd, offset, length, name), edits)
        emit(length, pieces, part)

    # Slices small enough that every worker gets several, so none waits long at the end.
    size_each = block_size or max(READ_SIZE, min(WORKER_BLOCK, size // (8 * workers) + 1))
    with worker_pool(workers) as pool:
        for offset, length in plan_slices(fd, size, size_each):
            where = _FileSlice(path, device, inode, offset, length)
            pending.append((offset, length, pool.submit(_slice_edits, where, 1, validate)))
            if len(pending) >= 2 * workers:
                splice()
        while pending:
            splice()
