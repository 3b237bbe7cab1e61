"""Parquet files for ``toolpair normalize``: the ``messages`` or ``input`` column in call order.

A training set in Parquet keeps the conversation in one column, in one of two
ways, and both are read and written back the way they came:

- as JSON text (a string or binary column): each cell is normalized like a
  JSONL line holding that field, so a cell that does not change keeps its exact
  text, and a cell that is not JSON is copied and counted as bad;
- as a native nested column (a list of structs): Arrow gives every struct in a
  column the same fields, a field a message did not have being null. The rules
  only move whole list elements, so a changed row is the same elements in
  another order, written back with the input's own type: no field is added or
  dropped, and a null stays a null.

``messages`` gets the Chat Completions and Anthropic rules, ``input`` the
Responses rules; a file with both gets both. Every other column, the schema
(with its metadata, which is how ``datasets`` restores its features), the row
order and the row count are kept. The file is read and written one row group at
a time, so memory holds one row group; only the column being normalized is
converted to Python, and only the rows that changed are rebuilt. A nested
column goes faster still (see "nested columns, the fast way" below): only rows
that can hold a run become Python, and moved rows are rebuilt in Arrow.
"""

from __future__ import annotations

import os
from array import array as packed
from collections import deque
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import TYPE_CHECKING, Any, BinaryIO, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from proxy.normalize.core import LineKind, LineResult, NormalizeTally, normalize_line, order_record
from proxy.normalize.files import NormalizeFailed
from proxy.normalize.pool import worker_pool

if TYPE_CHECKING:
    from concurrent.futures import Future

__all__ = ["COLUMNS", "ParquetInput", "normalize_parquet"]

COLUMNS = ("messages", "input")
"""The columns normalized: Chat Completions or Anthropic messages, and Responses input items."""

ColumnKind = Literal["text", "nested"]
_BLANK = LineResult(LineKind.BLANK)


class ParquetInput:
    """An open Parquet file and the columns of it to normalize; NormalizeFailed when there are none."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.file = pq.ParquetFile(path)
        except OSError as exc:  # no such file, no permission
            raise NormalizeFailed(f"cannot read {path}: {exc.strerror or exc}") from None
        except pa.ArrowException as exc:
            raise NormalizeFailed(f"{path} is not a Parquet file ({exc})") from None
        self.schema: pa.Schema = self.file.schema_arrow
        try:
            self.kinds = {
                name: _column_kind(path, self.schema.field(name)) for name in COLUMNS if name in self.schema.names
            }
        except NormalizeFailed:
            self.close()
            raise
        if not self.kinds:
            names = ", ".join(self.schema.names) or "none"
            self.close()
            raise NormalizeFailed(f"{path} has no 'messages' or 'input' column to normalize (its columns: {names})")
        self.columns = list(self.kinds)
        metadata = self.file.metadata
        self.row_groups: int = metadata.num_row_groups
        self.compression = "snappy"
        if self.row_groups and metadata.num_columns:
            codec = str(metadata.row_group(0).column(0).compression).lower()
            self.compression = "none" if codec == "uncompressed" else codec
        self.done = 0

    def fraction(self) -> float | None:
        return self.done / self.row_groups if self.row_groups else None

    def read(self, index: int) -> pa.Table:
        try:
            return self.file.read_row_group(index)
        except (OSError, pa.ArrowException) as exc:
            raise NormalizeFailed(f"cannot read row group {index} of {self.path}: {exc}") from None

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> ParquetInput:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def _column_kind(path: str, field: pa.Field) -> ColumnKind:
    kind = field.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        return "text"
    if pa.types.is_large_binary(kind):
        return "text"
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return "nested"
    raise NormalizeFailed(
        f"column {field.name!r} of {path} is {kind}: toolpair reads a list of messages or items, or JSON text"
    )


Step = Callable[[int, NormalizeTally], None]
"""Called after each row group: its size in the file, and its tally (rows numbered from 0)."""


def normalize_parquet(
    source: ParquetInput, sink: BinaryIO | None, step: Step, *, validate: bool = False, workers: int = 1
) -> None:
    """Normalize every row group of ``source``; write each to ``sink`` (None: only count, for ``--check``).

    With ``workers > 1`` row groups are normalized in worker processes, each
    reading its row group from the file itself; results are written in order,
    with at most two row groups per worker in flight.
    """
    writer = None
    if sink is not None:
        try:
            writer = pq.ParquetWriter(sink, source.schema, compression=source.compression)
        except (OSError, pa.ArrowException) as exc:
            raise NormalizeFailed(f"cannot write Parquet: {exc}") from None
    try:
        for index, (fresh, tally) in enumerate(_normalized_row_groups(source, validate, workers)):
            if writer is not None:
                try:
                    writer.write_table(fresh, row_group_size=max(1, fresh.num_rows))
                except (OSError, pa.ArrowException) as exc:
                    raise NormalizeFailed(f"cannot write Parquet: {exc}") from None
            source.done = index + 1
            step(source.file.metadata.row_group(index).total_byte_size, tally)
    finally:
        if writer is not None:
            try:
                writer.close()
            except (OSError, pa.ArrowException) as exc:
                raise NormalizeFailed(f"cannot write Parquet: {exc}") from None


def _normalized_row_groups(
    source: ParquetInput, validate: bool, workers: int
) -> Iterator[tuple[pa.Table, NormalizeTally]]:
    """Each row group normalized, in order: here, or by worker processes."""
    metadata = source.file.metadata
    first_rows = [0]
    for index in range(source.row_groups):
        first_rows.append(first_rows[-1] + metadata.row_group(index).num_rows)
    if workers <= 1 or source.row_groups < 2:
        for index in range(source.row_groups):
            yield normalize_table(source.read(index), source.kinds, first_rows[index], validate=validate)
        return
    info = os.stat(source.path)
    where = (os.path.abspath(source.path), info.st_dev, info.st_ino)
    pending: deque[Future[tuple[pa.Table, NormalizeTally]]] = deque()
    with worker_pool(workers) as pool:
        for index in range(source.row_groups):
            task = (*where, index, first_rows[index], source.kinds, validate)
            pending.append(pool.submit(_row_group_in_worker, *task))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


_worker_inputs: dict[str, ParquetInput] = {}  # in a worker process: the input file, opened once


def _row_group_in_worker(
    path: str, device: int, inode: int, index: int, first_row: int, kinds: dict[str, ColumnKind], validate: bool
) -> tuple[pa.Table, NormalizeTally]:
    """In a worker: read one row group from the file itself and normalize it."""
    source = _worker_inputs.get(path)
    if source is None:
        info = os.stat(path)
        if (info.st_dev, info.st_ino) != (device, inode):
            raise NormalizeFailed(f"{path} was replaced while it was being read")
        source = _worker_inputs[path] = ParquetInput(path)
    return normalize_table(source.read(index), kinds, first_row, validate=validate)


def normalize_table(
    table: pa.Table, kinds: dict[str, ColumnKind], first_row: int = 0, *, validate: bool = False
) -> tuple[pa.Table, NormalizeTally]:
    """One row group: the table with its conversation columns in call order, and the tally by row."""
    per_column: list[list[LineResult]] = []
    for name, kind in kinds.items():
        position = table.schema.get_field_index(name)
        column = table.column(position)
        fresh, results = _normalize_column(name, kind, column, validate)
        if fresh is not column:
            table = table.set_column(position, table.schema.field(position), fresh)
        per_column.append(results)
    tally = NormalizeTally()
    for row, row_results in enumerate(zip(*per_column, strict=True), first_row):
        tally.add(row, row_results[0] if len(row_results) == 1 else _merged(row_results))
    return table, tally


def _merged(results: tuple[LineResult, ...]) -> LineResult:
    """One row's result over several columns: bad if any is, blank if all are."""
    kinds = {result.kind for result in results}
    kind = LineKind.BAD if LineKind.BAD in kinds else LineKind.BLANK if kinds == {LineKind.BLANK} else LineKind.RECORD
    report = results[0].report
    for result in results[1:]:
        report = report.merged(result.report)
    return LineResult(kind, any(result.changed for result in results), report)


def _normalize_column(
    name: str, kind: ColumnKind, column: pa.ChunkedArray, validate: bool
) -> tuple[pa.ChunkedArray, list[LineResult]]:
    if kind == "nested":
        array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        done = _normalize_nested(name, array)
        if done is not None:
            return done
    return _normalize_rows(name, kind, column, validate)


def _normalize_rows(
    name: str, kind: ColumnKind, column: pa.ChunkedArray, validate: bool
) -> tuple[pa.ChunkedArray, list[LineResult]]:
    """Every row converted to Python and normalized; changed rows rebuilt from their Python values.

    The general way, for text columns and for nested ones the faster way below declines.
    """
    values = column.to_pylist()
    changes: dict[int, Any] = {}
    results: list[LineResult] = []
    for row, value in enumerate(values):
        if value is None:
            results.append(_BLANK)
        elif kind == "text":
            text = value.encode() if isinstance(value, str) else value
            out, result = normalize_line(text, validate=validate, field=name)
            if out is not text:
                changes[row] = out.decode() if isinstance(value, str) else out
            results.append(result)
        else:
            record = {name: value}
            ordered, report = order_record(record)
            if ordered is not record:
                changes[row] = ordered[name]
            results.append(LineResult(LineKind.RECORD, ordered is not record, report))
    if not changes:
        return column, results
    return _with_rows_replaced(column, changes), results


# --- nested columns, the fast way -------------------------------------------------
#
# Converting a row group's nested column to Python dicts, and building changed
# rows back from them, is most of the time a Parquet run takes. Two shortcuts,
# each exact and each falling back to ``_normalize_rows`` where it cannot be:
#
# - Only rows that can hold a run are converted: for ``messages`` a row with a
#   ``role: "tool"`` message, for ``input`` a row with an ``*_output`` item
#   (found with Arrow's compute functions on the flattened column). Messages
#   whose ``content`` is a list could hold Anthropic runs, so such a column is
#   converted whole.
# - The chat and Responses rules only move whole elements of a row's list, so a
#   changed row is its own elements in another order: the column is rebuilt by
#   ``take`` on its flattened elements, in Arrow, with the input's own type.
#   An Anthropic reorder edits a message's ``content`` instead; a row group with
#   one goes the general way.


def _int64s(values: list[int]) -> pa.Array:
    """An int64 array made from its buffer: ``pa.array`` would import pandas (a quarter second) when it is installed."""
    return pa.Array.from_buffers(pa.int64(), len(values), [None, pa.py_buffer(packed("q", values))])


def _texts(values: list[str] | list[bytes], kind: pa.DataType) -> pa.Array:
    """A string or binary array of ``kind`` made from its buffers (no nulls), for the same reason."""
    blobs = [value.encode() if isinstance(value, str) else value for value in values]
    offsets = packed("q" if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind) else "i", [0])
    for blob in blobs:
        offsets.append(offsets[-1] + len(blob))
    return pa.Array.from_buffers(kind, len(blobs), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(blobs))])


_RESULT_ROLES = ["tool"]
_OUTPUT_TYPES = ["function_call_output", "custom_tool_call_output"]


def _normalize_nested(name: str, array: pa.Array) -> tuple[pa.ChunkedArray, list[LineResult]] | None:
    """The column normalized by the shortcuts above; None when they do not apply."""
    if not isinstance(array, pa.ListArray | pa.LargeListArray) or array.offset:
        return None
    candidates = _rows_that_may_hold_runs(name, array)
    nulls = array.is_null().to_pylist()
    results: list[LineResult] = [_BLANK if null else _NO_RUN_ROW for null in nulls]
    rows = range(len(array)) if candidates is None else candidates
    values = (array if candidates is None else array.take(_int64s(candidates))).to_pylist()
    orders: dict[int, list[int]] = {}
    for row, value in zip(rows, values, strict=True):
        if value is None:
            continue
        record = {name: value}
        ordered, report = order_record(record)
        changed = ordered is not record
        results[row] = LineResult(LineKind.RECORD, changed, report)
        if changed:
            order = _element_order(value, ordered[name])
            if order is None:
                return None
            orders[row] = order
    if not orders:
        return pa.chunked_array([array], type=array.type), results
    return pa.chunked_array([_with_elements_taken(array, orders)], type=array.type), results


_NO_RUN_ROW = LineResult(LineKind.RECORD)


def _rows_that_may_hold_runs(name: str, array: pa.ListArray | pa.LargeListArray) -> list[int] | None:
    """Rows with an element a run needs (in ascending order); None when every row must be looked at."""
    element = array.type.value_type
    if not pa.types.is_struct(element):
        return None
    fields = {element.field(i).name: element.field(i).type for i in range(element.num_fields)}
    if name == "messages":
        key, wanted = "role", _RESULT_ROLES
        content = fields.get("content")
        if content is not None and not _is_text(content):
            return None  # content blocks: Anthropic runs are possible in any row with user messages
    else:
        key, wanted = "type", _OUTPUT_TYPES
    if key not in fields:
        return []  # no element has a role (or a type): no row holds a run
    if not _is_text(fields[key]):
        return None
    flat = pc.list_flatten(array)
    hits = pc.is_in(flat.field(key), value_set=_texts(wanted, fields[key]))
    parents = pc.filter(pc.list_parent_indices(array), hits)
    rows: list[int] = pc.unique(parents).to_pylist()
    return rows


def _is_text(kind: pa.DataType) -> bool:
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind))


def _element_order(original: list[Any], ordered: list[Any]) -> list[int] | None:
    """Where each element of ``ordered`` was in ``original``; None if one is not an original element."""
    if len(original) != len(ordered):
        return None
    where = {id(item): index for index, item in enumerate(original) if item is not None}
    order = []
    for index, item in enumerate(ordered):
        if item is None:
            if original[index] is not None:
                return None
            order.append(index)  # a null element never moves: it cannot be part of a run
            continue
        found = where.get(id(item))
        if found is None:
            return None
        order.append(found)
    return order


def _with_elements_taken(array: pa.ListArray | pa.LargeListArray, orders: dict[int, list[int]]) -> pa.Array:
    """The list column with each listed row's elements put in the given order, by ``take`` on the elements."""
    offsets = array.offsets.to_pylist()
    base, end = offsets[0], offsets[-1]
    picks = list(range(end - base))
    for row, order in orders.items():
        start = offsets[row] - base
        picks[start : start + len(order)] = [start + position for position in order]
    elements = array.values.slice(base, end - base).take(_int64s(picks))
    large = isinstance(array, pa.LargeListArray)
    offset_type = pa.int64() if large else pa.int32()
    fresh_offsets = pa.Array.from_buffers(
        offset_type, len(offsets), [None, pa.py_buffer(packed("q" if large else "i", [o - base for o in offsets]))]
    )
    mask = array.is_null() if array.null_count else None
    return type(array).from_arrays(fresh_offsets, elements, type=array.type, mask=mask)


def _with_rows_replaced(column: pa.ChunkedArray, changes: dict[int, Any]) -> pa.ChunkedArray:
    """The column with the changed rows rebuilt in its own type; every other row is the input's, uncopied."""
    array = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    pieces: list[pa.Array] = []
    position = 0
    rows = sorted(changes)
    start = 0
    while start < len(rows):
        end = start
        while end + 1 < len(rows) and rows[end + 1] == rows[end] + 1:
            end += 1  # a run of consecutive changed rows becomes one piece
        first, last = rows[start], rows[end]
        if first > position:
            pieces.append(array.slice(position, first - position))
        fresh = [changes[row] for row in range(first, last + 1)]
        kind = array.type
        text = pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
        if text or pa.types.is_large_binary(kind):
            pieces.append(_texts(fresh, kind))
        else:
            pieces.append(pa.array(fresh, type=kind))
        position = last + 1
        start = end + 1
    if position < len(array):
        pieces.append(array.slice(position))
    return pa.chunked_array([pa.concat_arrays(pieces)], type=array.type)
