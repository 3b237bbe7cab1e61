"""Argument values that a format writes as text, typed by the tool's JSON schema.

Several families write each argument as raw text between tags (Qwen3-Coder's
``<parameter=K>``, GLM's ``<arg_value>``, MiniMax's and DSML's
``<parameter name="K">``): the text alone cannot say whether ``3`` meant a
number or a string. The request's tool schema can, so every such format types
its values here, one rule for all of them.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from proxy.engine.toolcalls._calls import dump_arguments
from proxy.engine.toolcalls._scan import loads_strict

__all__ = ["convert_value", "parameter_schemas", "typed_arguments"]

_JSON_TYPE: dict[type, str] = {bool: "boolean", int: "integer", float: "number", dict: "object", list: "array"}


def _schema_types(schema: Any) -> list[str]:
    if not isinstance(schema, dict):
        return []
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    types: list[str] = []
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key) or ():
            types.extend(t for t in _schema_types(option) if t not in types)
    if not types and isinstance(schema.get("enum"), list):
        types = sorted({_JSON_TYPE.get(type(v), "string") for v in schema["enum"]})
    return types


def _as_type(value: str, kind: str) -> tuple[bool, Any]:
    text = value.strip()
    if kind in ("integer", "number", "object", "array"):
        try:
            parsed = loads_strict(text)
        except ValueError:
            if kind not in ("object", "array"):
                return False, None
            try:  # Python-style literals ({'a': True}) that models sometimes write
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return False, None
        if kind == "integer" and isinstance(parsed, float) and parsed.is_integer() and "." not in text:
            parsed = int(parsed)
        wanted = {"integer": (int,), "number": (int, float), "object": (dict,), "array": (list,)}[kind]
        ok = isinstance(parsed, wanted) and not isinstance(parsed, bool)
        return ok, parsed
    if kind == "boolean" and text.lower() in ("true", "false"):
        return True, text.lower() == "true"
    if kind == "null" and text.lower() in ("null", "none"):
        return True, None
    return False, None


def convert_value(value: str, schema: Any) -> Any:
    """A parameter's text as the type its schema names; text stays text when nothing fits.

    >>> convert_value("3", {"type": "integer"}), convert_value("3", {"type": "string"})
    (3, '3')
    >>> convert_value('{"a": [1]}', {"type": "object"}), convert_value("TRUE", {"type": ["null", "boolean"]})
    ({'a': [1]}, True)
    """
    types = _schema_types(schema)
    for kind in types:
        if kind == "string":
            continue
        ok, parsed = _as_type(value, kind)
        if ok:
            return parsed
    return value


def parameter_schemas(tools: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The ``properties`` of tool ``name``'s parameters schema (empty for an unknown tool)."""
    schema = tools.get(name)
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return properties if isinstance(properties, dict) else {}


def typed_arguments(tools: Mapping[str, Any], name: str, values: Mapping[str, str]) -> str:
    """A call's text values, each typed by tool ``name``'s schema, as the JSON arguments text.

    >>> typed_arguments({"f": {"properties": {"n": {"type": "integer"}}}}, "f", {"n": "2", "s": "2"})
    '{"n":2,"s":"2"}'
    """
    schema = parameter_schemas(tools, name)
    return dump_arguments({k: convert_value(v, schema.get(k)) for k, v in values.items()})
