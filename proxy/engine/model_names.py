"""The model name a request asks the engine for, and the name its answer carries back.

Clients name models the engine has never heard of: Claude Code sends ``claude-*`` names (a Haiku
one for background work), Codex its own; llama-server's router, vLLM and Ollama refuse a name they
do not know, and llama-swap matches exact aliases only. So, per request:

- the first ``model_map`` entry (``PATTERN=MODEL``, an :mod:`fnmatch` glob, case-sensitive on every
  system) whose pattern matches the asked name sends ``MODEL`` instead;
- without a map, an engine that lists exactly one model at ``/v1/models`` gets that model for a
  name it does not know (its ids and aliases are the names it knows); so does llama-server's
  router (``--models-dir``: many models, loaded on demand) with exactly one of them loaded;
- otherwise the name goes as the client sent it. Where the engine then refuses a name it does not
  list, the client gets the engine's words plus the names it knows and the flag that maps others
  (:func:`refused_name`), in its API's own error shape.

Whenever the name sent differs from the one asked, the answer names the asked one again (whole
and streamed): a client checks the model it gets back against the one it asked for.

Pure: :func:`plan_model` decides (a :class:`ModelPlan`); :func:`with_model` applies it to a decoded
body (the same body when nothing changes, so the client's bytes still go as they are), and
:func:`restore_model` / :func:`restore_chunk` put the asked name back into the answer's bytes or
chunk dicts. The engine's list is read by :func:`listed_models` from what
:class:`~proxy.engine.watch.EngineWatch` fetched; the handlers carry the plan out.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import orjson

from proxy._types import Body
from proxy.config import ConfigError

__all__ = [
    "MODELS_PATH",
    "NO_MODELS",
    "NO_NAMES",
    "REFUSAL_STATUSES",
    "EngineModels",
    "MapEntry",
    "ModelNames",
    "ModelPlan",
    "listed_models",
    "model_line",
    "parse_model_map",
    "plan_model",
    "refused_name",
    "restore_chunk",
    "restore_model",
    "with_model",
]

MODELS_PATH = "/v1/models"
"""Where the engine lists its models (OpenAI's shape: ``data[].id``; llama-server adds ``aliases``)."""


@dataclass(frozen=True)
class MapEntry:
    """One ``--model-map PATTERN=MODEL``."""

    pattern: str
    model: str

    def __str__(self) -> str:
        return f"{self.pattern}={self.model}"


def parse_model_map(entries: Sequence[str]) -> tuple[MapEntry, ...]:
    """The ``model_map`` setting's entries, in order; a malformed one is a :class:`~proxy.config.ConfigError`.

    The pattern ends at the first ``=``, so a pattern holds none (model names rarely do either).

    >>> parse_model_map(["claude-*haiku*=qwen3-0.6b", "claude-*=qwen3-30b"])[1]
    MapEntry(pattern='claude-*', model='qwen3-30b')
    """
    parsed = []
    for entry in entries:
        pattern, equals, model = entry.partition("=")
        if not equals or not pattern.strip() or not model.strip():
            raise ConfigError(f"model_map: {entry!r} is not PATTERN=MODEL (e.g. 'claude-*=qwen3')")
        parsed.append(MapEntry(pattern.strip(), model.strip()))
    return tuple(parsed)


@dataclass(frozen=True)
class EngineModels:
    """What the engine listed at ``/v1/models``: one id per model, and every name it answers to."""

    ids: tuple[str, ...] = ()
    known: frozenset[str] = frozenset()
    """The ids and their aliases."""
    router: bool = False
    """The list carries llama-server's router statuses (``--models-dir``): models load on demand."""
    running: tuple[str, ...] = ()
    """The router's models that are loaded, loading or asleep (those it answers without a new load)."""

    @property
    def only(self) -> str | None:
        """The one model a name the engine does not know goes to: its only one, or the router's only loaded one."""
        if len(self.ids) == 1:
            return self.ids[0]
        return self.running[0] if self.router and len(self.running) == 1 else None

    @property
    def names(self) -> tuple[str, ...]:
        """Every name it answers to, ids first, in the engine's order."""
        return (*self.ids, *sorted(self.known.difference(self.ids)))


NO_MODELS = EngineModels()
"""Nothing listed (not asked, not answered, or not in OpenAI's shape)."""


_RUNNING = frozenset({"loaded", "loading", "sleeping"})
"""Router statuses of a model that answers without a new load (``unloaded``, ``failed``... do not)."""


def listed_models(body: object) -> EngineModels:
    """The models in a ``/v1/models`` answer (its decoded JSON); :data:`NO_MODELS` for anything else.

    >>> answer = {"object": "list", "data": [{"id": "/models/gemma.gguf", "aliases": ["gemma"]}]}
    >>> found = listed_models(answer)
    >>> found.only, sorted(found.known)
    ('/models/gemma.gguf', ['/models/gemma.gguf', 'gemma'])
    >>> router = listed_models({"data": [{"id": "a", "status": {"value": "unloaded"}},
    ...                                  {"id": "b", "status": {"value": "loaded"}}]})
    >>> router.router, router.running, router.only
    (True, ('b',), 'b')
    >>> listed_models({"error": "unauthorized"}) == NO_MODELS
    True
    """
    data = body.get("data") if isinstance(body, dict) else None
    ids: list[str] = []
    known: set[str] = set()
    router = False
    running: list[str] = []
    for entry in data if isinstance(data, list) else ():
        model = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(model, str) or not model or model in ids:
            continue
        ids.append(model)
        known.add(model)
        aliases = entry.get("aliases")
        known.update(a for a in (aliases if isinstance(aliases, list) else ()) if isinstance(a, str) and a)
        status = entry.get("status")
        if isinstance(status, dict) and isinstance(status.get("value"), str):
            router = True
            if status["value"] in _RUNNING:
                running.append(model)
    return EngineModels(tuple(ids), frozenset(known), router, tuple(running))


class ModelPlan(NamedTuple):
    """The name one request sends the engine, and why (a named tuple: one is made per request)."""

    asked: str | None
    """The client's ``model``; None when it sent none, or not a string (the engine answers that)."""
    send: str | None
    reason: str
    """``map`` (an entry matched), ``one_model`` (the engine's only model), ``loaded_model`` (the router's
    only loaded one), ``setting`` (``messages_model``), ``unknown`` (a name the engine does not list,
    sent as asked: a refusal gets its names), ``as_asked``."""
    entry: MapEntry | None = None
    listed: tuple[str, ...] = ()
    """For ``unknown``: the names the engine knows, for the refusal."""

    @property
    def changed(self) -> bool:
        return self.send != self.asked


def plan_model(asked: object, model_map: Sequence[MapEntry], engine_models: EngineModels = NO_MODELS) -> ModelPlan:
    """The model name for a request that asked for ``asked``.

    >>> plan_model("claude-opus-4", parse_model_map(["claude-*=qwen3"])).send
    'qwen3'
    >>> plan_model("claude-opus-4", (), listed_models({"data": [{"id": "gemma"}]})).reason
    'one_model'
    >>> plan_model("gemma", (), listed_models({"data": [{"id": "gemma"}]})).changed
    False
    >>> plan_model("claude-opus-4", (), listed_models({"data": [{"id": "a"}, {"id": "b"}]})).listed
    ('a', 'b')
    """
    if not isinstance(asked, str):
        return ModelPlan(None, None, "as_asked")
    for entry in model_map:
        if fnmatch.fnmatchcase(asked, entry.pattern):
            return ModelPlan(asked, entry.model, "map", entry)
    if asked in engine_models.known or not engine_models.ids:
        return ModelPlan(asked, asked, "as_asked")
    only = engine_models.only
    if not model_map and only is not None:
        return ModelPlan(asked, only, "one_model" if len(engine_models.ids) == 1 else "loaded_model")
    return ModelPlan(asked, asked, "unknown", listed=engine_models.names)


REFUSAL_STATUSES = frozenset({400, 404})
"""How engines refuse a model name they do not know (llama-server's router 400; vLLM, Ollama 404)."""
_LISTED_AT_MOST = 24


def refused_name(message: str, status: int, plan: ModelPlan | None) -> str | None:
    """The engine's refusal of a name it does not know, with the names it knows and the flag; else None.

    Only for a plan that sent a name the engine does not list, and only for a 400 or 404 whose
    message speaks of the model (and names it): any other refusal is about something else.

    >>> plan = plan_model("claude-opus-4", (), listed_models({"data": [{"id": "a"}, {"id": "b"}]}))
    >>> said = refused_name("model 'claude-opus-4' not found", 400, plan)
    >>> said.partition(" (")[2]
    "toolpair: the engine knows the models a, b; --model-map PATTERN=MODEL maps other names to one of them, ..."
    >>> refused_name("messages: field required", 400, plan) is None
    True
    """
    if plan is None or plan.reason != "unknown" or status not in REFUSAL_STATUSES:
        return None
    if "model" not in message.lower() or (plan.asked and plan.asked not in message):
        return None
    shown = ", ".join(plan.listed[:_LISTED_AT_MOST])
    more = f" and {len(plan.listed) - _LISTED_AT_MOST} more" if len(plan.listed) > _LISTED_AT_MOST else ""
    pattern = plan.asked.split("-", 1)[0] + "-*" if plan.asked and "-" in plan.asked else "*"
    return (
        f"{message} (toolpair: the engine knows the models {shown}{more}; --model-map PATTERN=MODEL maps other "
        f"names to one of them, e.g. --model-map '{pattern}={plan.listed[0]}')"
    )


@dataclass(frozen=True)
class ModelNames:
    """What model names are decided from, as known now: the map (settings) and the engine's list (found)."""

    model_map: tuple[MapEntry, ...] = ()
    engine_models: EngineModels = NO_MODELS

    def plan(self, body: object) -> ModelPlan:
        """The plan for a decoded request body (anything but an object asks for no name)."""
        return plan_model(body.get("model") if isinstance(body, dict) else None, self.model_map, self.engine_models)

    def plan_with(self, body: object, setting: str | None) -> ModelPlan:
        """The plan where a setting may name the model for a whole route (``messages_model``): it wins.

        >>> NO_NAMES.plan_with({"model": "claude-x"}, "gemma").reason
        'setting'
        """
        if not setting:
            return self.plan(body)
        asked = body.get("model") if isinstance(body, dict) else None
        return ModelPlan(asked if isinstance(asked, str) else None, setting, "setting")


NO_NAMES = ModelNames()
"""No map, no list: every name goes as sent."""


def with_model(body: Body, plan: ModelPlan) -> Body:
    """``body`` sending the planned name; the same object when the name does not change.

    >>> body = {"model": "claude-x", "messages": []}
    >>> with_model(body, plan_model("claude-x", parse_model_map(["claude-*=qwen3"])))
    {'model': 'qwen3', 'messages': []}
    >>> with_model(body, plan_model("claude-x", ())) is body
    True
    """
    if not plan.changed or plan.send is None:
        return body
    return {**body, "model": plan.send}  # a setting names the model even for a request that named none


_MODEL_VALUE = re.compile(rb'"model"(\s*):(\s*)"(?:[^"\\]|\\.)*"')
"""A ``"model": "..."`` member. In valid JSON an unescaped ``"model"`` followed by ``:`` is always an
object key (a quote inside a string is escaped), so text the model wrote never matches."""


def restore_model(data: bytes, plan: ModelPlan) -> bytes:
    """Answer bytes (a JSON body, or whole SSE frames) with every ``model`` member naming the asked model.

    Only string values are replaced, so a frame stays valid JSON; the same bytes come back when the
    plan changed nothing.

    >>> plan = plan_model("claude-x", parse_model_map(["claude-*=qwen3"]))
    >>> restore_model(b'data: {"model":"qwen3","delta":{"text":"\\\\"model\\\\":\\\\"a\\\\""}}\\n\\n', plan)
    b'data: {"model":"claude-x","delta":{"text":"\\\\"model\\\\":\\\\"a\\\\""}}\\n\\n'
    """
    if not plan.changed or plan.asked is None:
        return data
    name = orjson.dumps(plan.asked)
    return _MODEL_VALUE.sub(lambda m: b'"model"' + m[1] + b":" + m[2] + name, data)


def restore_chunk(chunk: Body | None, plan: ModelPlan) -> Body | None:
    """A decoded answer or chunk naming the asked model where it names one (``None``, a keep-alive, stays).

    >>> restore_chunk({"model": "qwen3", "choices": []}, plan_model("claude-x", parse_model_map(["*=qwen3"])))
    {'model': 'claude-x', 'choices': []}
    """
    if chunk is None or not plan.changed or plan.asked is None or not isinstance(chunk.get("model"), str):
        return chunk
    return {**chunk, "model": plan.asked}


def model_line(model_map: Sequence[MapEntry], engine_models: EngineModels | None) -> str:
    """The banner's line on model names; ``engine_models`` None: the engine's list is not known yet.

    >>> print(model_line(parse_model_map(["claude-*=qwen3"]), None))
      model names:    claude-*=qwen3 (first match; answers carry the client's name)
    >>> print(model_line((), listed_models({"data": [{"id": "gemma"}]})))
      model names:    one model: gemma (names the engine does not know go to it)
    """
    head = "  model names:    "
    if model_map:
        return head + ", ".join(map(str, model_map)) + " (first match; answers carry the client's name)"
    if engine_models is None:
        return head + "as sent; an engine listing one model gets it for names it does not know (--model-map)"
    listed = ", ".join(engine_models.ids[:8]) + (", ..." if len(engine_models.ids) > 8 else "")
    if engine_models.only is not None and len(engine_models.ids) == 1:
        return head + f"one model: {engine_models.only} (names the engine does not know go to it)"
    if engine_models.only is not None:
        return head + (
            f"one loaded of the router's {len(engine_models.ids)}: {engine_models.only} "
            "(names the engine does not know go to it while it is the only one loaded)"
        )
    if engine_models.router:
        loaded = ", ".join(engine_models.running) or "none"
        shown = f"the router lists {len(engine_models.ids)}: {listed}; loaded: {loaded}"
    else:
        shown = f"the engine lists {len(engine_models.ids)}: {listed}" if engine_models.ids else "the engine lists none"
    return head + f"as sent ({shown}; --model-map PATTERN=MODEL maps others)"
