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
converted to Python, and only the rows that changed are rebuilt.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Any, BinaryIO, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from proxy.normalize.core import LineKind, LineResult, NormalizeTally, normalize_line, order_record
from proxy.normalize.files import NormalizeFailed

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


def normalize_parquet(source: ParquetInput, sink: BinaryIO | None, step: Step, *, validate: bool = False) -> None:
    """Normalize every row group of ``source``; write each to ``sink`` (None: only count, for ``--check``)."""
    writer = None
    if sink is not None:
        try:
            writer = pq.ParquetWriter(sink, source.schema, compression=source.compression)
        except (OSError, pa.ArrowException) as exc:
            raise NormalizeFailed(f"cannot write Parquet: {exc}") from None
    try:
        first_row = 0
        for index in range(source.row_groups):
            table = source.read(index)
            fresh, tally = normalize_table(table, source.kinds, first_row, validate=validate)
            if writer is not None:
                try:
                    writer.write_table(fresh, row_group_size=max(1, fresh.num_rows))
                except (OSError, pa.ArrowException) as exc:
                    raise NormalizeFailed(f"cannot write Parquet: {exc}") from None
            first_row += table.num_rows
            source.done = index + 1
            step(source.file.metadata.row_group(index).total_byte_size, tally)
    finally:
        if writer is not None:
            try:
                writer.close()
            except (OSError, pa.ArrowException) as exc:
                raise NormalizeFailed(f"cannot write Parquet: {exc}") from None


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
        pieces.append(pa.array([changes[row] for row in range(first, last + 1)], type=array.type))
        position = last + 1
        start = end + 1
    if position < len(array):
        pieces.append(array.slice(position))
    return pa.chunked_array([pa.concat_arrays(pieces)], type=array.type)
