"""Read a GGUF file's metadata header without loading the model.

``serve`` needs two facts before it starts the engine: the context length the
model was trained with (to size ``n_ctx``) and whether the file carries a chat
template (to pick an override). Both live in the key/value header at the start
of the file. Arrays (the vocabulary) are skipped, not stored, so reading the
header of a large model takes milliseconds and little memory.

Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

__all__ = ["GGUFError", "Metadata", "chat_template", "context_length", "read_metadata"]

Metadata = dict[str, object]
"""Scalar values by key; an array is stored as ``("array", length)``."""

_MAGIC = b"GGUF"
_STRING = 8
_ARRAY = 9
# GGUF value type -> struct format of one item.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_MAX_STRING = 64 * 1024 * 1024  # a chat template is long; anything past this is a corrupt length


class GGUFError(ValueError):
    """Raised when a file is not GGUF or its header is cut short or corrupt."""


class _Reader:
    def __init__(self, file: BinaryIO, name: str) -> None:
        self._file = file
        self._name = name

    def exact(self, size: int) -> bytes:
        data = self._file.read(size)
        if len(data) != size:
            raise GGUFError(f"{self._name}: the GGUF header is cut short")
        return data

    def unpack(self, fmt: str) -> object:
        value: object = struct.unpack("<" + fmt, self.exact(struct.calcsize("<" + fmt)))[0]
        return value

    def count(self) -> int:
        value = self.unpack("Q")
        assert isinstance(value, int)
        return value

    def string(self) -> str:
        length = self.count()
        if length > _MAX_STRING:
            raise GGUFError(f"{self._name}: a string of {length} bytes in the header; the file is corrupt")
        return self.exact(length).decode("utf-8", "replace")

    def skip(self, size: int) -> None:
        self._file.seek(size, 1)

    def value(self, kind: int) -> object:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item = self.unpack("I")
            length = self.count()
            if item == _STRING:
                for _ in range(length):
                    self.skip(self.count())
            elif item in _SCALARS:
                self.skip(struct.calcsize("<" + _SCALARS[item]) * length)
            else:
                raise GGUFError(f"{self._name}: unknown array item type {item}")
            return ("array", length)
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        raise GGUFError(f"{self._name}: unknown value type {kind}")


def read_metadata(path: str | Path) -> Metadata:
    """All scalar metadata of a GGUF file (version 2 or 3), by key."""
    name = str(path)
    try:
        with Path(path).open("rb") as file:
            return _read(_Reader(file, name), file, name)
    except OSError as exc:
        raise GGUFError(f"cannot read {name}: {exc.strerror}") from None


def _read(reader: _Reader, file: BinaryIO, name: str) -> Metadata:
    if file.read(4) != _MAGIC:
        raise GGUFError(f"{name} is not a GGUF model file")
    version = reader.unpack("I")
    if version not in (2, 3):
        raise GGUFError(f"{name}: GGUF version {version} is not supported")
    reader.count()  # tensor count
    metadata: Metadata = {}
    for _ in range(reader.count()):
        key = reader.string()
        kind = reader.unpack("I")
        assert isinstance(kind, int)
        metadata[key] = reader.value(kind)
    return metadata


def context_length(metadata: Metadata) -> int | None:
    """The training context of the model, from ``<architecture>.context_length``.

    >>> context_length({"general.architecture": "gemma3", "gemma3.context_length": 32768})
    32768
    """
    arch = metadata.get("general.architecture")
    value = metadata.get(f"{arch}.context_length") if isinstance(arch, str) else None
    return value if isinstance(value, int) and value > 0 else None


def chat_template(metadata: Metadata) -> str | None:
    """The model's own Jinja chat template, when the file carries one.

    >>> chat_template({"tokenizer.chat_template": "{{ messages }}"})
    '{{ messages }}'
    """
    value = metadata.get("tokenizer.chat_template")
    return value if isinstance(value, str) and value.strip() else None
