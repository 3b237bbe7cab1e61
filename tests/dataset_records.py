"""Dataset records in the three wire forms, for the ``toolpair normalize`` tests.

Each builder takes the calls in call order (ID, argument) and the results in
the order they arrived (ID, output), so a test can say exactly which result
belongs to which call.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from hypothesis import strategies as st

from tests.support.conversations import anthropic_calls, assistant_calls, function_call, tool_result, tool_use

Pairs = Sequence[tuple[Any, str]]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up the value stored under a key.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
]


def chat(calls: Pairs, results: Pairs, question: str = "Look up A and B.") -> dict[str, Any]:
    """An OpenAI chat record: one assistant turn with parallel calls, then the tool messages."""
    return {
        "messages": [
            {"role": "user", "content": question},
            assistant_calls(
                *(function_call(call_id, "lookup", orjson.dumps({"key": key}).decode()) for call_id, key in calls)
            ),
            *(tool_result(call_id, output) for call_id, output in results),
            {"role": "assistant", "content": "Done."},
        ],
        "tools": TOOLS,
    }


def anthropic(calls: Pairs, results: Pairs) -> dict[str, Any]:
    """An Anthropic Messages record: tool_use blocks, then one user turn of tool_result blocks."""
    return {
        "system": "You are a careful agent.",
        "messages": [
            {"role": "user", "content": "Look up the keys."},
            anthropic_calls(*(tool_use(i, "lookup", {"key": k}) for i, k in calls), text="Looking up."),
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": i, "content": out} for i, out in results],
            },
        ],
    }


def responses(calls: Pairs, results: Pairs) -> dict[str, Any]:
    """A Responses record: function_call items, then function_call_output items, in ``input``."""
    return {
        "model": "agent",
        "input": [
            {"role": "user", "content": "Look up the keys."},
            *(
                {
                    "type": "function_call",
                    "call_id": i,
                    "name": "lookup",
                    "arguments": orjson.dumps({"key": k}).decode(),
                }
                for i, k in calls
            ),
            *({"type": "function_call_output", "call_id": i, "output": out} for i, out in results),
        ],
    }


def sharegpt(text: str = "hello") -> dict[str, Any]:
    """A ShareGPT record: no IDs anywhere."""
    return {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": "hi"}]}


FORMS = {"chat": chat, "anthropic": anthropic, "responses": responses}


def jsonl(records: Iterable[Any]) -> bytes:
    """Records as compact JSONL, the way orjson writes them."""
    return b"".join(orjson.dumps(record) + b"\n" for record in records)


def arrived_in_any_order(calls: Sequence[tuple[str, str]]) -> st.SearchStrategy[dict[str, Any]]:
    """Records of any form with the first n of ``calls`` and their results in any order of arrival."""
    return st.builds(
        lambda form, arrival, n: FORMS[form](calls[:n], [(calls[i][0], str(i)) for i in arrival if i < n]),
        st.sampled_from(sorted(FORMS)),
        st.permutations(range(len(calls))),
        st.integers(1, len(calls)),
    )
