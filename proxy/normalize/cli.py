"""One ``toolpair normalize`` run: pick the format, normalize, write the output, report.

The rules live in ``core`` (pure); ``jsonl`` and ``parquet`` move the data;
this module only decides which of them runs, and says what happened:

- The format is JSONL (plain or gzip) unless ``--format parquet`` says
  otherwise, the input ends in ``.parquet`` / ``.pq``, or it starts with
  Parquet's magic bytes.
- Output goes to stdout or ``-o OUT``, through ``files.Output``: a failed run
  leaves no half-written file. Parquet needs a file on both sides: it is read
  and written by row group, with its footer at the end.
- ``--check`` writes nothing and exits 1 when a record would change;
  ``--report`` writes the tally as JSON; a summary of bad and changed records
  goes to stderr.

``toolpair normalize`` starts here (``main``), not in ``proxy.cli``: that module
loads the HTTP server, which costs about half a CPU-second, as long as
normalizing a 50 MB file takes.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO

from proxy.normalize.core import NormalizeTally
from proxy.normalize.files import NormalizeFailed, Output
from proxy.normalize.jsonl import JsonlSource, normalize_jsonl
from proxy.ops.progress import Progress

__all__ = [
    "FORMATS",
    "NormalizeFailed",
    "NormalizeJob",
    "add_arguments",
    "input_format",
    "main",
    "run_args",
    "run_normalize",
]

FORMATS = ("auto", "jsonl", "parquet")
Format = Literal["auto", "jsonl", "parquet"]
PARQUET_MAGIC = b"PAR1"
PARQUET_SUFFIXES = (".parquet", ".pq")


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
    format: Format = "auto"


def input_format(job: NormalizeJob) -> Literal["jsonl", "parquet"]:
    """What the input is: what the job says, else its name, else its first bytes."""
    if job.format != "auto":
        return job.format
    if job.source == "-":
        return "jsonl"
    if job.source.lower().endswith(PARQUET_SUFFIXES):
        return "parquet"
    try:
        with open(job.source, "rb") as file:
            return "parquet" if file.read(4) == PARQUET_MAGIC else "jsonl"
    except OSError:
        return "jsonl"  # the JSONL reader says what is wrong with the file


class _Run:
    """The state of one run: the tally so far, the output, the progress line."""

    def __init__(self, output: Output | None, progress: Progress | None, fraction: Callable[[], float | None]) -> None:
        self.output = output
        self.progress = progress
        self.fraction = fraction
        self.tally = NormalizeTally()
        self.done_bytes = 0

    def emit(self, block_in: int, pieces: list[bytes | memoryview], part: NormalizeTally) -> None:
        self.tally.merge(part)
        self.done_bytes += block_in
        if self.output is not None:
            for piece in pieces:
                self.output.write(piece)
        self.step()

    def step(self) -> None:
        if self.progress is not None:
            self.progress.update(self.tally.lines, self.done_bytes, self.fraction())


def _run_jsonl(job: NormalizeJob, stdin: BinaryIO, stdout: BinaryIO, progress: Progress | None) -> NormalizeTally:
    try:
        source = JsonlSource(job.source, stdin)
    except OSError as exc:
        raise NormalizeFailed(f"cannot read {job.source}: {exc.strerror or exc}") from None
    output: Output | None = None
    try:
        output = None if job.check else Output.open(job.output, stdout)
        run = _Run(output, progress, source.fraction)
        normalize_jsonl(
            source,
            run.emit,
            workers=job.workers,
            validate=job.validate,
            block_size=job.block_size,
            write=output is not None,
        )
        if progress is not None:
            progress.done(run.tally.lines, run.done_bytes, 1.0 if source.size else None)
        if output is not None:
            output.commit()
        return run.tally
    finally:
        if output is not None:
            output.abort()
        source.close()


def _run_parquet(job: NormalizeJob, stdout: BinaryIO, progress: Progress | None) -> tuple[NormalizeTally, list[str]]:
    try:
        from proxy.normalize.parquet import ParquetInput, normalize_parquet
    except ImportError as exc:  # pyarrow is the optional [parquet] extra
        raise NormalizeFailed(f"Parquet needs pyarrow ({exc}): pip install 'toolpair[parquet]'") from None
    if job.source == "-":
        raise NormalizeFailed("Parquet is read by row group from its footer: give a file, not stdin")
    if not job.check and job.output in (None, "-"):
        raise NormalizeFailed("Parquet output needs a file: -o OUT.parquet, or --check")
    with ParquetInput(job.source) as source:
        output = None if job.check else Output.open(job.output, stdout, compress=False)
        try:
            run = _Run(output, progress, source.fraction)

            def step(rows_bytes: int, part: NormalizeTally) -> None:
                run.tally.merge(part)
                run.done_bytes += rows_bytes
                run.step()

            sink = None if output is None else output.file
            normalize_parquet(source, sink, step, validate=job.validate, workers=job.workers)
            if progress is not None:
                progress.done(run.tally.lines, run.done_bytes, 1.0)
            if output is not None:
                output.commit()
            return run.tally, source.columns
        finally:
            if output is not None:
                output.abort()


def _write_report(job: NormalizeJob, document: dict[str, Any]) -> None:
    if job.report is None:
        return
    try:
        Path(job.report).write_text(json.dumps(document, indent=2) + "\n")
    except OSError as exc:
        raise NormalizeFailed(f"cannot write report {job.report}: {exc.strerror or exc}") from None


def _summarize(job: NormalizeJob, tally: NormalizeTally, stderr: TextIO, unit: str) -> None:
    if tally.bad:
        stderr.write(
            f"toolpair normalize: {tally.bad:,} bad {unit}(s) copied through unchanged "
            f"(first at {unit} {tally.bad_lines[0]})\n"
        )
    if job.check and tally.changed:
        numbers = ", ".join(str(n) for n in tally.changed_lines[:10])
        more = ", ..." if tally.changed > 10 else ""
        stderr.write(
            f"toolpair normalize: {tally.changed:,} of {tally.records:,} records would change "
            f"({unit}s {numbers}{more})\n"
        )


def run_normalize(
    job: NormalizeJob,
    *,
    stdin: BinaryIO | None = None,
    stdout: BinaryIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Carry out one run and return the exit status: 0, or 1 when ``check`` finds changes.

    Raises NormalizeFailed when a file cannot be read or written, or is not what
    its format says.
    """
    stdin = stdin if stdin is not None else sys.stdin.buffer
    stdout = stdout if stdout is not None else sys.stdout.buffer
    stderr = stderr if stderr is not None else sys.stderr
    show = job.progress if job.progress is not None else stderr.isatty()
    progress = Progress(stderr) if show else None
    collecting = gc.isenabled()
    gc.disable()  # parsed records hold no cycles; the collector would only walk them
    try:
        if input_format(job) == "parquet":
            tally, columns = _run_parquet(job, stdout, progress)
            unit = "row"
            document = {"input": job.source, "check": job.check, "format": "parquet", "columns": columns}
            document.update(tally.as_report(rows=True))
        else:
            tally = _run_jsonl(job, stdin, stdout, progress)
            unit = "line"
            document = {"input": job.source, "check": job.check, **tally.as_report()}
        _write_report(job, document)
        _summarize(job, tally, stderr, unit)
        return 1 if job.check and tally.changed else 0
    finally:
        if collecting:
            gc.enable()


# --- the command line ---------------------------------------------------------

HELP = "put tool results in JSONL or Parquet datasets into call order"
DESCRIPTION = (
    "Rewrite a JSONL dataset of chat, Anthropic or Responses records so that each run of tool "
    "results is in call order, with the rules the proxy applies. Every input line gives one "
    "output line; records that do not change are written back byte for byte, lines that are "
    "not JSON are copied through and counted. IN may be '-' (stdin) and may be gzip. "
    "A Parquet file (by name or content) gets its 'messages' or 'input' column reordered, "
    "nested or JSON text, row group by row group; every other column is kept as it was. "
    "Exit status: 0 done, 1 --check found records that would change, 2 a file problem."
)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``toolpair normalize``, for its own parser and for ``toolpair --help``."""
    parser.add_argument("input", metavar="IN", help="JSONL, JSONL.gz or Parquet file, or - for stdin (JSONL)")
    target = parser.add_mutually_exclusive_group()
    target.add_argument("-o", "--output", metavar="OUT", help="write here (.gz compresses JSONL); default stdout")
    target.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if any record would change (for CI)"
    )
    parser.add_argument("--report", metavar="FILE", help="write counts, kept-run reasons and bad lines as JSON")
    parser.add_argument("--workers", type=_positive, default=1, metavar="N", help="processes to use (default 1)")
    parser.add_argument(
        "--validate",
        action="store_true",
        help="also parse lines without tool-result IDs, so bad ones among them are counted (slower)",
    )
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="input format (default auto: Parquet by name or magic bytes, else JSONL); the output has the same",
    )


def run_args(args: argparse.Namespace) -> int:
    """Run what the parsed command line asks for; the exit status, with file problems said on stderr."""
    job = NormalizeJob(
        source=args.input,
        output=args.output,
        check=args.check,
        report=args.report,
        workers=args.workers,
        validate=args.validate,
        format=args.format,
    )
    try:
        return run_normalize(job)
    except NormalizeFailed as exc:
        print(f"toolpair normalize: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of stdout went away: end quietly, and keep Python from
        # complaining when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        return 130  # run_normalize has already removed any half-written output


def main(argv: Sequence[str] | None = None) -> int:
    """``toolpair normalize ARGS``, without loading the rest of toolpair."""
    parser = argparse.ArgumentParser(prog="toolpair normalize", description=DESCRIPTION)
    add_arguments(parser)
    return run_args(parser.parse_args(argv))
