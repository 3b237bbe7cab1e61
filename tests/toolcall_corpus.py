"""Model outputs for each tool-call format, written from the formats' documented shapes.

Each case says what the reply must become: the content text, the reasoning
text, the calls (name and arguments as decoded JSON) and how many call blocks
are malformed. ``options`` are :class:`~proxy.engine.toolcalls.ExtractOptions` fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"],
}
TYPED = {
    "type": "object",
    "properties": {
        "path": {"type": "string"},
        "code": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "force": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "meta": {"type": "object"},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    },
}
TOOLS: dict[str, Any] = {"get_weather": WEATHER, "get_time": {"type": "object"}, "write_file": TYPED}


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    options: dict[str, Any]
    content: str = ""
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    reasoning: str = ""
    malformed: int = 0
    ids: list[str] | None = None
    """IDs the format fixes (None: generated ones are checked for their shape)."""


def stays_text(case_id: str, text: str, options: dict[str, Any]) -> Case:
    """A malformed block: all of ``text`` stays content, and it counts once as malformed."""
    return Case(case_id, text, options, content=text, malformed=1)


def hermes(**extra: Any) -> dict[str, Any]:
    return {"calls": "hermes", "tools": TOOLS, **extra}


def coder(**extra: Any) -> dict[str, Any]:
    return {"calls": "qwen3-coder", "tools": TOOLS, **extra}


def mistral(**extra: Any) -> dict[str, Any]:
    return {"calls": "mistral", "tools": TOOLS, **extra}


def llama3(**extra: Any) -> dict[str, Any]:
    return {"calls": "llama3", "tools": TOOLS, **extra}


PARIS = ("get_weather", {"city": "Paris"})
OSLO = ("get_weather", {"city": "Oslo"})
H_PARIS = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
H_OSLO = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'

CASES: list[Case] = [
    # Hermes, Qwen 2.5, Qwen 3: <tool_call>{"name", "arguments"}</tool_call>, one or more
    Case("hermes-one", H_PARIS, hermes(), calls=[PARIS]),
    Case("hermes-two-with-text", "I'll check both cities.\n\n" + H_PARIS + "\n" + H_OSLO, hermes(),
         content="I'll check both cities.", calls=[PARIS, OSLO]),
    Case("hermes-text-after", H_PARIS + "\n\nWaiting for the result.", hermes(),
         content="Waiting for the result.", calls=[PARIS]),
    Case("hermes-no-closing-tag", '<tool_call>\n{"name": "get_time", "arguments": {}}', hermes(),
         calls=[("get_time", {})]),
    Case("hermes-same-line", 'Sure <tool_call>{"name":"get_time","arguments":{"tz":"Europe/Zürich"}}</tool_call>',
         hermes(), content="Sure", calls=[("get_time", {"tz": "Europe/Zürich"})]),
    Case("hermes-braces-in-strings",
         '<tool_call>\n{"name": "write_file", "arguments": {"code": "if (x) { return \\"}\\"; } // <tool_call>"}}'
         "\n</tool_call>",
         hermes(), calls=[("write_file", {"code": 'if (x) { return "}"; } // <tool_call>'})]),
    Case("hermes-double-encoded-arguments",
         '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"東京\\"}"}\n</tool_call>',
         hermes(), calls=[("get_weather", {"city": "東京"})]),
    Case("hermes-parameters-key", '<tool_call>{"name": "get_weather", "parameters": {"city": "Paris"}}</tool_call>',
         hermes(), calls=[PARIS]),
    Case("hermes-plain-text", "Paris is sunny today, 21°C.", hermes(), content="Paris is sunny today, 21°C."),
    Case("hermes-near-markers", "Use <tool> tags, or <tool_calls>, then stop at <tool_", hermes(),
         content="Use <tool> tags, or <tool_calls>, then stop at <tool_"),
    stays_text("hermes-malformed-json",
               '<tool_call>\n{"name": "get_weather", "arguments": {"city": }}\n</tool_call>', hermes()),
    stays_text("hermes-malformed-not-an-object", 'Try:\n<tool_call>\n["get_weather", "Paris"]\n</tool_call>', hermes()),
    stays_text("hermes-malformed-no-name", '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>', hermes()),
    stays_text("hermes-malformed-cut-off", 'Checking.\n<tool_call>\n{"name": "get_weather", "argu', hermes()),
    Case("hermes-good-then-malformed", H_PARIS + '\n<tool_call>\n{"name": "get_weather", "arguments": {"city": 1,}}',
         hermes(), calls=[PARIS], content='<tool_call>\n{"name": "get_weather", "arguments": {"city": 1,}}',
         malformed=1),
    stays_text("hermes-nan-is-not-json", '<tool_call>{"name": "f", "arguments": {"x": NaN}}</tool_call>', hermes()),
    Case("hermes-parallel-off", H_PARIS + "\n" + H_OSLO, hermes(parallel=False), calls=[PARIS]),
    Case("hermes-qwen3-thinking", "<think>\nThe user wants the weather.\n</think>\n\n" + H_PARIS,
         hermes(reasoning=True), reasoning="The user wants the weather.\n", calls=[PARIS]),
    Case("hermes-calls-inside-think-are-thoughts", "<think>maybe " + H_OSLO + "</think>" + H_PARIS,
         hermes(reasoning=True), reasoning="maybe " + H_OSLO, calls=[PARIS]),
    # Qwen3-Coder: <tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>
    Case("coder-typed",
         "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
         "<parameter=code>\nprint('hi')\n\nx = {'a': 1}\n</parameter>\n<parameter=count>\n3\n</parameter>\n"
         "<parameter=ratio>\n0.5\n</parameter>\n<parameter=force>\nTrue\n</parameter>\n"
         '<parameter=tags>\n["a", "b"]\n</parameter>\n<parameter=meta>\n{\'k\': None}\n</parameter>\n'
         "<parameter=limit>\nnull\n</parameter>\n</function>\n</tool_call>",
         coder(),
         calls=[("write_file", {"path": "/tmp/a.py", "code": "print('hi')\n\nx = {'a': 1}", "count": 3, "ratio": 0.5,
                                "force": True, "tags": ["a", "b"], "meta": {"k": None}, "limit": None})]),
    Case("coder-string-stays-string",
         "<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=days>\n2\n"
         "</parameter>\n</function>\n</tool_call>",
         coder(), calls=[("get_weather", {"city": "123", "days": 2})]),
    Case("coder-two-calls-with-text",
         "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
         "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n"
         "</tool_call>",
         coder(), content="Let me look.", calls=[PARIS, OSLO]),
    Case("coder-missing-parameter-close",
         "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\nx\n</function>\n</tool_call>",
         coder(), calls=[("get_weather", {"city": "Paris", "days": "x"})]),
    Case("coder-bare-function", "<function=get_time>\n</function>", coder(), calls=[("get_time", {})]),
    Case("coder-unknown-tool-keeps-text-values",
         "<tool_call><function=other><parameter=n>5</parameter></function></tool_call>",
         coder(), calls=[("other", {"n": "5"})]),
    stays_text("coder-malformed-cut-off", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar", coder()),
    stays_text("coder-malformed-tag", "<tool_call>\n<func name=get_weather>\n</tool_call>", coder()),
    stays_text("coder-malformed-name", "<tool_call>\n<function=get\nweather>\n</function></tool_call>", coder()),
    Case("coder-hermes-json-also-read", H_PARIS, coder(), calls=[PARIS]),
    # Mistral: [TOOL_CALLS][{"name", "arguments"}, ...] and [TOOL_CALLS]name[ARGS]{...}, 9-character IDs
    Case("mistral-list",
         '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
         '{"name": "get_weather", "arguments": {"city": "Oslo"}}]',
         mistral(), calls=[PARIS, OSLO]),
    Case("mistral-list-with-ids",
         '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1B2c3D4e"},'
         ' {"name": "get_weather", "arguments": {"city": "Oslo"}, "id": "bad-id"}]',
         mistral(), calls=[PARIS, OSLO], ids=["a1B2c3D4e", "*"]),
    Case("mistral-v11",
         '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}',
         mistral(), calls=[PARIS, ("get_time", {"tz": "CET"})]),
    Case("mistral-v11-call-id", '[TOOL_CALLS]get_weather[CALL_ID]Zx9Yw8Vu7[ARGS]{"city": "Oslo"}', mistral(),
         calls=[OSLO], ids=["Zx9Yw8Vu7"]),
    Case("mistral-text-before", 'Checking now.[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', mistral(),
         content="Checking now.", calls=[("get_time", {})]),
    Case("mistral-bare-list", '[{"name": "get_weather", "arguments": {"city": "Paris"}}]', mistral(),
         calls=[PARIS]),
    Case("mistral-bare-list-not-calls", '[{"name": "Ada", "arguments": {"age": 36}}] is the answer.', mistral(),
         content='[{"name": "Ada", "arguments": {"age": 36}}] is the answer.'),
    stays_text("mistral-malformed-cut-off",
               '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Par', mistral()),
    Case("mistral-malformed-second",
         '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, 42]',
         mistral(), calls=[PARIS], content=", 42]", malformed=1),
    stays_text("mistral-malformed-v11", "[TOOL_CALLS]get_weather[ARGS]city=Paris", mistral()),
    # Llama 3.x: {"name", "parameters"} and <|python_tag|>
    Case("llama3-json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', llama3(), calls=[PARIS]),
    Case("llama3-json-two", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
         '{"name": "get_weather", "parameters": {"city": "Oslo"}}', llama3(), calls=[PARIS, OSLO]),
    Case("llama3-json-answer-is-not-a-call", '{"city": "Paris", "temp": 21}', llama3(),
         content='{"city": "Paris", "temp": 21}'),
    Case("llama3-unknown-name-is-not-a-call", '{"name": "Ada", "parameters": {"age": 36}}', llama3(),
         content='{"name": "Ada", "parameters": {"age": 36}}'),
    Case("llama3-json-not-at-start", 'Call: {"name": "get_weather", "parameters": {"city": "Paris"}}', llama3(),
         content='Call: {"name": "get_weather", "parameters": {"city": "Paris"}}'),
    Case("llama3-python-tag-json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
         llama3(), calls=[PARIS]),
    Case("llama3-python-tag-builtin", '<|python_tag|>brave_search.call(query="weather in Paris")<|eom_id|>',
         llama3(), calls=[("brave_search", {"query": "weather in Paris"})]),
    Case("llama3-python-tag-then-text", '<|python_tag|>{"name": "get_time", "parameters": {}}\nDone.', llama3(),
         calls=[("get_time", {})], content="Done."),
    stays_text("llama3-malformed-python", '<|python_tag|>print("hi")', llama3()),
    stays_text("llama3-malformed-json",
               '<|python_tag|>{"name": "get_weather", "parameters": {"city": Paris}}', llama3()),
    # auto: every marked form
    Case("auto-hermes", H_PARIS, {"calls": "auto", "tools": TOOLS}, calls=[PARIS]),
    Case("auto-mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', {"calls": "auto", "tools": TOOLS},
         calls=[("get_time", {})]),
    Case("auto-python-tag", '<|python_tag|>{"name": "get_time", "parameters": {}}',
         {"calls": "auto", "tools": TOOLS}, calls=[("get_time", {})]),
    # Llama 3.x's bare call (llama-cpp-python drops <|python_tag|>): auto reads it when tools were sent
    Case("auto-bare-json", '{"name": "get_time", "parameters": {}}', {"calls": "auto", "tools": TOOLS},
         calls=[("get_time", {})]),
    Case("auto-bare-json-unknown-tool", '{"name": "rm_rf", "parameters": {}}', {"calls": "auto", "tools": TOOLS},
         content='{"name": "rm_rf", "parameters": {}}'),
    Case("auto-bare-json-answer", '{"city": "Paris"}', {"calls": "auto", "tools": TOOLS}, content='{"city": "Paris"}'),
    # reasoning
    Case("think", "<think>Paris is in France.</think>The answer is Paris.", {"reasoning": True},
         reasoning="Paris is in France.", content="The answer is Paris."),
    Case("think-leading-space", "\n <think>\nstep 1\nstep 2\n</think>\n\nDone", {"reasoning": True},
         reasoning="step 1\nstep 2\n", content="Done"),
    Case("think-open-in-prompt", "Paris is in France.\n</think>\n\nParis.", {"reasoning": True, "think_open": True},
         reasoning="Paris is in France.\n", content="Paris."),
    Case("think-cut-off", "<think>still thinking about </thi", {"reasoning": True},
         reasoning="still thinking about </thi"),
    Case("think-off", "<think>x</think>y", {"reasoning": False}, content="<think>x</think>y"),
    Case("think-not-at-start", "a <think>x</think>", {"reasoning": True}, content="a <think>x</think>"),
    Case("think-empty-qwen3", "<think>\n\n</think>\n\nHello!", {"reasoning": True}, content="Hello!"),
    Case("think-plain", "<thinking is fun>", {"reasoning": True}, content="<thinking is fun>"),
]  # fmt: skip
