"""Model names per request (proxy/engine/model_names.py): the plan and the answer's name, pure, no network."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from proxy.config import ConfigError
from proxy.engine.model_names import (
    NO_MODELS,
    EngineModels,
    ModelNames,
    listed_models,
    model_line,
    parse_model_map,
    plan_model,
    refused_name,
    restore_chunk,
    restore_model,
    with_model,
)

MAP = parse_model_map(["claude-*haiku*=qwen3-0.6b", "claude-*=qwen3-30b", "gpt-?=gpt-oss", "local-model=gemma"])
ONE = listed_models({"object": "list", "data": [{"id": "/models/gemma.gguf", "aliases": ["gemma", "g3"]}]})
TWO = listed_models({"data": [{"id": "qwen3"}, {"id": "gemma"}]})


def router(**statuses: str) -> EngineModels:
    """llama-server's router list (``--models-dir``): every model with its status."""
    return listed_models({"data": [{"id": name, "aliases": [], "status": {"value": value, "args": []}}
                                   for name, value in statuses.items()]})  # fmt: skip


NONE_LOADED = router(gemma="unloaded", smollm2="unloaded")
ONE_LOADED = router(gemma="unloaded", smollm2="loaded")


@pytest.mark.parametrize(
    ("asked", "model_map", "models", "send", "reason"),
    [
        # the map: first match wins, globs, exact names, case kept
        ("claude-haiku-4-5-20251001", MAP, NO_MODELS, "qwen3-0.6b", "map"),
        ("claude-opus-4-5", MAP, NO_MODELS, "qwen3-30b", "map"),
        ("claude-opus-4-5", MAP, ONE, "qwen3-30b", "map"),
        ("gpt-5", MAP, NO_MODELS, "gpt-oss", "map"),
        ("gpt-5.1", MAP, NO_MODELS, "gpt-5.1", "as_asked"),  # ? is one character
        ("local-model", MAP, NO_MODELS, "gemma", "map"),
        ("Claude-opus", MAP, NO_MODELS, "Claude-opus", "as_asked"),  # case-sensitive on every system
        ("qwen3-30b", MAP, NO_MODELS, "qwen3-30b", "as_asked"),
        # a map that names the model asked for changes nothing
        ("qwen3-30b", parse_model_map(["qwen*=qwen3-30b"]), NO_MODELS, "qwen3-30b", "map"),
        # no map, one model listed: unknown names go to it; its id and aliases are known
        ("claude-opus-4-5", (), ONE, "/models/gemma.gguf", "one_model"),
        ("gemma", (), ONE, "gemma", "as_asked"),
        ("/models/gemma.gguf", (), ONE, "/models/gemma.gguf", "as_asked"),
        # a map that does not match does not fall back to the one model
        ("mistral", MAP, ONE, "mistral", "unknown"),
        # several models: the name goes as sent, a refusal gets the names; none listed: nothing to say
        ("claude-opus-4-5", (), TWO, "claude-opus-4-5", "unknown"),
        ("claude-opus-4-5", (), NO_MODELS, "claude-opus-4-5", "as_asked"),
        # the router: its one loaded model is the one model; none or several loaded, as sent
        ("claude-opus-4-5", (), ONE_LOADED, "smollm2", "loaded_model"),
        ("claude-haiku-4-5", (), router(a="unloaded", b="loading", c="failed"), "b", "loaded_model"),
        ("local-model", (), router(a="sleeping", b="unloaded"), "a", "loaded_model"),
        ("gemma", (), ONE_LOADED, "gemma", "as_asked"),  # a name it knows loads that one
        ("claude-opus-4-5", (), NONE_LOADED, "claude-opus-4-5", "unknown"),
        ("claude-opus-4-5", (), router(a="loaded", b="loaded"), "claude-opus-4-5", "unknown"),
        ("claude-opus-4-5", MAP, ONE_LOADED, "qwen3-30b", "map"),
        ("mistral", MAP, ONE_LOADED, "mistral", "unknown"),
        ("gemma", (), router(gemma="unloaded"), "gemma", "as_asked"),
        ("claude-opus-4-5", (), router(gemma="unloaded"), "gemma", "one_model"),
        ("", (), ONE, "/models/gemma.gguf", "one_model"),
        # no name, or not a string: nothing to decide, the engine answers it
        (None, MAP, ONE, None, "as_asked"),
        (7, MAP, ONE, None, "as_asked"),
        (["claude"], (), ONE, None, "as_asked"),
    ],
)  # fmt: skip
def test_the_plan_names_the_model_the_engine_gets(
    asked: Any, model_map: Any, models: EngineModels, send: str | None, reason: str
) -> None:
    plan = plan_model(asked, model_map, models)
    assert (plan.send, plan.reason) == (send, reason)
    assert plan.changed is (isinstance(asked, str) and send != asked)
    assert plan.asked == (asked if isinstance(asked, str) else None)
    assert ModelNames(tuple(model_map), models).plan({"model": asked}) == plan


def test_the_matching_entry_is_named_in_the_plan() -> None:
    assert str(plan_model("claude-haiku-4-5", MAP).entry) == "claude-*haiku*=qwen3-0.6b"
    assert plan_model("claude-haiku-4-5", ()).entry is None


@pytest.mark.parametrize(
    ("entries", "parsed"),
    [
        ([], []),
        (["claude-*=qwen3"], [("claude-*", "qwen3")]),
        ([" claude-* = qwen3 "], [("claude-*", "qwen3")]),
        (["a=b=c"], [("a", "b=c")]),  # the pattern ends at the first "="
        (["*=hf.co/org/model:Q4_K_M"], [("*", "hf.co/org/model:Q4_K_M")]),
    ],
)
def test_the_map_is_read_in_order(entries: list[str], parsed: list[tuple[str, str]]) -> None:
    assert [(e.pattern, e.model) for e in parse_model_map(entries)] == parsed


@pytest.mark.parametrize("entry", ["claude-*", "=qwen3", "claude-*=", " = ", ""])
def test_an_entry_without_a_pattern_and_a_model_is_refused(entry: str) -> None:
    with pytest.raises(ConfigError, match=r"model_map: .* is not PATTERN=MODEL"):
        parse_model_map(["ok=m", entry])


def test_the_plan_for_an_unknown_name_keeps_the_names_the_engine_knows() -> None:
    listed = [{"id": "b", "aliases": ["z", "a"]}, {"id": "c", "status": {"value": "unloaded"}}]
    aliased = listed_models({"data": listed})
    assert plan_model("claude-x", (), aliased).listed == ("b", "c", "a", "z")
    assert plan_model("claude-x", (), ONE).listed == ()  # it goes to the one model: nothing to list


ROUTER_REFUSAL = "model 'claude-opus-5-5' not found"  # llama-server's router, answering 400


@pytest.mark.parametrize(
    ("asked", "models", "status", "message", "refused"),
    [
        ("claude-opus-5-5", NONE_LOADED, 400, ROUTER_REFUSAL, True),
        ("claude-opus-5-5", TWO, 404, "The model `claude-opus-5-5` does not exist.", True),  # vLLM's
        ("claude-opus-5-5", NONE_LOADED, 404, 'model "claude-opus-5-5" not found, try pulling it first', True),
        ("", NONE_LOADED, 400, "model name is missing from the request", True),
        # another refusal, another status, or a plan that did not send an unknown name: the engine's own words
        ("claude-opus-5-5", NONE_LOADED, 400, "'messages' is required", False),
        ("claude-opus-5-5", NONE_LOADED, 400, "model 'other' not found", False),
        ("claude-opus-5-5", NONE_LOADED, 401, ROUTER_REFUSAL, False),
        ("claude-opus-5-5", NONE_LOADED, 500, ROUTER_REFUSAL, False),
        ("claude-opus-5-5", ONE_LOADED, 400, ROUTER_REFUSAL, False),
        ("gemma", NONE_LOADED, 400, "model 'gemma' failed to load", False),
        ("claude-opus-5-5", NO_MODELS, 400, ROUTER_REFUSAL, False),
    ],
)  # fmt: skip
def test_a_refused_unknown_name_gets_the_engines_names_and_the_flag(
    asked: str, models: EngineModels, status: int, message: str, refused: bool
) -> None:
    said = refused_name(message, status, plan_model(asked, (), models))
    if not refused:
        assert said is None
        return
    assert said is not None and said.startswith(message + " (toolpair: the engine knows the models ")
    assert ", ".join(models.ids) in said and "--model-map PATTERN=MODEL" in said


def test_a_refusal_suggests_a_map_from_the_asked_name_and_cuts_a_long_list() -> None:
    many = listed_models({"data": [{"id": f"m{i}"} for i in range(30)]})
    said = refused_name("model 'claude-opus-5-5' not found", 400, plan_model("claude-opus-5-5", (), many))
    assert said is not None and "m23 and 6 more;" in said and "m24" not in said
    assert said.endswith("e.g. --model-map 'claude-*=m0')")
    assert refused_name("model 'local' not found", 404, plan_model("local", (), many)) is not None
    assert refused_name("no", 400, None) is None


@pytest.mark.parametrize(
    ("body", "ids", "known"),
    [
        ({"data": [{"id": "a", "aliases": ["b"]}, {"id": "c"}]}, ("a", "c"), {"a", "b", "c"}),
        ({"data": [{"id": "a"}, {"id": "a"}]}, ("a",), {"a"}),  # listed twice: one model
        ({"data": [{"id": ""}, {"id": 3}, "x", {"name": "n"}]}, (), set()),
        ({"data": [{"id": "a", "aliases": "a2"}]}, ("a",), {"a"}),
        ({"models": [{"name": "a"}]}, (), set()),  # Ollama's native list is not OpenAI's shape
        ({"error": {"message": "unauthorized"}}, (), set()),
        ([{"id": "a"}], (), set()),
        (None, (), set()),
    ],
)
def test_the_engines_list_is_read_from_openais_shape(body: Any, ids: tuple[str, ...], known: set[str]) -> None:
    found = listed_models(body)
    assert (found.ids, set(found.known)) == (ids, known)


def test_a_body_sends_the_planned_name_and_is_the_same_object_when_nothing_changes() -> None:
    body = {"model": "claude-opus-4-5", "messages": [{"role": "user", "content": "Hi"}]}
    mapped = with_model(body, plan_model(body["model"], MAP))
    assert mapped == {**body, "model": "qwen3-30b"} and list(mapped) == list(body)  # the key keeps its place
    assert body["model"] == "claude-opus-4-5"  # the caller's object is not touched
    for unchanged in (plan_model("qwen3", MAP), plan_model(None, MAP), plan_model("m", (), TWO)):
        assert with_model(body, unchanged) is body


CLAUDE = plan_model("claude-opus-4-5", MAP)


@pytest.mark.parametrize(
    ("answer", "restored"),
    [
        (b'{"id":"x","model":"qwen3-30b","choices":[]}', b'{"id":"x","model":"claude-opus-4-5","choices":[]}'),
        (b'{"model" : "qwen3-30b"}', b'{"model" : "claude-opus-4-5"}'),  # the engine's spacing stays
        (b'{"model":"/m/q.gguf"}', b'{"model":"claude-opus-4-5"}'),  # whatever name the engine gave
        (b'{"model":"a \\" b"}', b'{"model":"claude-opus-4-5"}'),  # an escaped quote inside the name
        # Anthropic's message_start and a Responses event name it one level down
        (b'event: message_start\ndata: {"type":"message_start","message":{"model":"q"}}\n\n',
         b'event: message_start\ndata: {"type":"message_start","message":{"model":"claude-opus-4-5"}}\n\n'),
        (b'data: {"model":"q"}\n\ndata: {"model":"q"}\n\ndata: [DONE]\n\n',
         b'data: {"model":"claude-opus-4-5"}\n\ndata: {"model":"claude-opus-4-5"}\n\ndata: [DONE]\n\n'),
        # what the model wrote is a string: its quotes are escaped, so it never matches
        (b'{"content":"say \\"model\\":\\"x\\"","model":"q"}',
         b'{"content":"say \\"model\\":\\"x\\"","model":"claude-opus-4-5"}'),
        (b'{"content":"model","usage":{}}', b'{"content":"model","usage":{}}'),
        (b'{"model":null}', b'{"model":null}'),  # only string names are replaced
        (b'{"error":{"message":"model not found"}}', b'{"error":{"message":"model not found"}}'),
    ],
)  # fmt: skip
def test_the_answer_names_the_model_the_client_asked_for(answer: bytes, restored: bytes) -> None:
    assert restore_model(answer, CLAUDE) == restored


def test_an_answer_to_an_unchanged_name_is_the_same_bytes() -> None:
    answer = b'{"model":"/m/q.gguf","choices":[]}'
    assert restore_model(answer, plan_model("qwen3", ())) is answer
    assert restore_model(answer, plan_model(None, MAP)) is answer


def test_a_name_with_json_escapes_is_written_as_json() -> None:
    plan = plan_model('claude-"odd"\\name\u00e9', parse_model_map(["claude-*=q"]))
    restored = restore_model(b'data: {"model":"q","x":1}\n\n', plan)
    assert orjson.loads(restored[6:]) == {"model": 'claude-"odd"\\name\u00e9', "x": 1}


def test_a_decoded_chunk_names_the_asked_model() -> None:
    chunk = {"id": "c", "model": "qwen3-30b", "choices": []}
    assert restore_chunk(chunk, CLAUDE) == {**chunk, "model": "claude-opus-4-5"}
    assert chunk["model"] == "qwen3-30b"
    assert restore_chunk(None, CLAUDE) is None
    no_name = {"choices": []}
    assert restore_chunk(no_name, CLAUDE) is no_name
    assert restore_chunk(chunk, plan_model("qwen3", ())) is chunk


@pytest.mark.parametrize(
    ("model_map", "models", "line"),
    [
        (MAP[:2], None, "claude-*haiku*=qwen3-0.6b, claude-*=qwen3-30b (first match; answers carry the client's name)"),
        (MAP[:1], ONE, "claude-*haiku*=qwen3-0.6b (first match; answers carry the client's name)"),
        ((), ONE, "one model: /models/gemma.gguf (names the engine does not know go to it)"),
        ((), TWO, "as sent (the engine lists 2: qwen3, gemma; --model-map PATTERN=MODEL maps others)"),
        ((), ONE_LOADED, "one loaded of the router's 2: smollm2 "
                         "(names the engine does not know go to it while it is the only one loaded)"),
        ((), NONE_LOADED, "as sent (the router lists 2: gemma, smollm2; loaded: none; "
                          "--model-map PATTERN=MODEL maps others)"),
        ((), NO_MODELS, "as sent (the engine lists none; --model-map PATTERN=MODEL maps others)"),
        ((), None, "as sent; an engine listing one model gets it for names it does not know (--model-map)"),
    ],
)  # fmt: skip
def test_the_banner_says_what_applies(model_map: Any, models: EngineModels | None, line: str) -> None:
    assert model_line(model_map, models) == "  model names:    " + line
