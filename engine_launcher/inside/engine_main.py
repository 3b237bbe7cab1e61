"""Code toolpair runs inside the engine's process: its changes to llama-cpp-python, listed in one table.

``python -m engine_launcher.inside.engine_main [--amx] MODULE ARGS...`` applies every fix in
:data:`ENGINE_FIXES`, then runs MODULE (``llama_cpp.server``, or :mod:`engine_launcher.inside.rpc`,
which registers RPC workers first) exactly as ``python -m`` would. ``--amx`` is the ``engine_amx``
setting, passed by the launcher: this process reads no setting of its own.

Each fix reaches into llama-cpp-python's internals (private names such as ``_logits_all``,
``scores``, ``ChatFormatterResponse``), so each row of the table says what it changes, why, the
llama-cpp-python release it was checked against (:data:`~engine_launcher.builder.version.LLAMA_CPP_VERSION`,
the one pin) and the test that fails without it. A new release means reading every row again; a
test holds the installed release to the rows.

The engine's patched Jinja formatter renders by calling
:func:`engine_launcher.templates.chat_template.render_prompt`, the function check-template and
count_tokens render with: one renderer, so what they show is what the engine reads.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import importlib
import runpy
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from engine_launcher.builder.template_file import template_file_parts
from engine_launcher.builder.version import LLAMA_CPP_VERSION
from engine_launcher.templates.chat_template import render_prompt

__all__ = [
    "ENGINE_FIXES",
    "EngineFix",
    "bound_prompt_cache",
    "extra_buffer_types",
    "keep_weights_off_amx",
    "load_without_extra_buffers",
    "main",
    "render_chat_templates_as_models_expect",
    "take_template_kwargs_per_request",
    "write_control_tokens_as_text",
]

AMX_SETTING = "TOOLPAIR_ENGINE_AMX"
"""The setting (``engine_amx``) that keeps llama.cpp's AMX weight path; read in toolpair's settings, never here."""


def bound_prompt_cache() -> None:
    """Bound the RAM prompt cache by what it really holds.

    llama-cpp-python's RAM cache keeps its entries under ``cache_size`` by counting each entry's
    llama.cpp state only. Every entry also holds a copy of the server's Python-side logits rows:
    with ``logits_all`` off that is up to n_batch x n_vocab float32 values (512 MiB for Gemma's
    262,144-token vocabulary) that nothing ever reads back, since sampling happens inside llama.cpp.
    A 1 GiB cache of 40 MB conversation states would hold 25 of them: 13 GiB in truth.

    The fix: with ``logits_all`` off, saving and restoring a state see the logits array as its first
    row only, so a saved state carries one row (1 MiB) instead of up to n_batch rows, and neither step
    copies or writes the rest. And the cache counts each entry's logits and token arrays against its
    bound, so ``cache_size`` is what the cache holds.
    """
    # Imported by name: toolpair's own checks run where the engine may not be installed yet.
    llama: Any = importlib.import_module("llama_cpp.llama")
    llama_cache: Any = importlib.import_module("llama_cpp.llama_cache")
    save_state, load_state = llama.Llama.save_state, llama.Llama.load_state

    def save_compact_state(self: Any) -> Any:
        if self._logits_all:
            return save_state(self)
        with _first_logits_row(self):
            return save_state(self)

    def load_compact_state(self: Any, state: Any) -> None:
        if self._logits_all:
            load_state(self, state)
            return
        with _first_logits_row(self):
            load_state(self, state)

    def held_bytes(self: Any) -> int:
        return sum(s.llama_state_size + s.scores.nbytes + s.input_ids.nbytes for s in self.cache_state.values())

    llama.Llama.save_state = save_compact_state
    llama.Llama.load_state = load_compact_state
    llama_cache.LlamaRAMCache.cache_size = property(held_bytes)


@contextlib.contextmanager
def _first_logits_row(model: Any) -> Iterator[None]:
    """Show ``model`` its logits array as one row (its rows are unused without logits_all)."""
    scores = model.scores
    model.scores = scores[:1]
    try:
        yield
    finally:
        model.scores = scores


_REQUEST_TEMPLATE_KWARGS: contextvars.ContextVar[Mapping[str, Any] | None] = contextvars.ContextVar(
    "request_template_kwargs", default=None
)
"""The ``chat_template_kwargs`` of the chat request being formatted now (set around one call)."""


def render_chat_templates_as_models_expect() -> None:
    """Have the engine's Jinja formatter render through :func:`~engine_launcher.templates.chat_template.render_prompt`.

    One renderer: what the engine reads is what ``check-template`` and ``count_tokens`` render,
    by construction rather than by a second copy of the rendering held equal by tests. So a model's
    own template (``Jinja2ChatFormatter``) gets tool-call arguments as objects and runs in
    :class:`~engine_launcher.templates.chat_template.TemplateSandbox` (Kimi K2 builds its own
    lists), with the load-time ``chat_template_kwargs`` and, where
    :func:`take_template_kwargs_per_request` is on, the request's. The formatter answers as
    llama-cpp-python's own does: its EOS text as the stop, its stop-token criterion, and the prompt
    marked as holding its special tokens. A template file (``--chat_format hf-tokenizer-config``:
    ``serve --chat-template-file`` and the bundled model's ChatML) is rendered by that same formatter,
    with a generation prompt, instead of plain jinja2 with an empty assistant message appended.
    The template llama-cpp-python compiles at load goes unused; ``render_prompt`` compiles it once
    more, in its own cache, on the first request (tens of milliseconds for a long template).
    """
    chat_format: Any = importlib.import_module("llama_cpp.llama_chat_format")
    llama: Any = importlib.import_module("llama_cpp.llama")
    if getattr(chat_format, "_toolpair_templates", False):
        return

    def format_with_render_prompt(
        self: Any,
        *,
        messages: Any,
        functions: Any = None,
        function_call: Any = None,
        tools: Any = None,
        tool_choice: Any = None,
        **kwargs: Any,
    ) -> Any:
        prompt = render_prompt(
            self.template,
            messages,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            tools=tools,
            tool_choice=tool_choice,
            functions=functions,
            function_call=function_call,
            template_kwargs={**kwargs, **(_REQUEST_TEMPLATE_KWARGS.get() or {})},
            add_generation_prompt=self.add_generation_prompt,
        )
        stopping_criteria = None
        if self.stop_token_ids is not None:
            stop_ids = self.stop_token_ids

            def stop_on_last_token(tokens: Any, logits: Any) -> bool:
                return bool(tokens[-1] in stop_ids)

            stopping_criteria = llama.StoppingCriteriaList([stop_on_last_token])
        return chat_format.ChatFormatterResponse(
            prompt=prompt, stop=[self.eos_token], stopping_criteria=stopping_criteria, added_special=True
        )

    def template_file_formatter(config: Any, add_generation_prompt: bool = True) -> Any:
        template, bos_token, eos_token = template_file_parts(config)
        formatter = chat_format.Jinja2ChatFormatter(
            template=template, eos_token=eos_token, bos_token=bos_token, add_generation_prompt=add_generation_prompt
        )
        if eos_token:
            return formatter

        def format_without_empty_stop(**kwargs: Any) -> Any:
            # The formatter stops on its EOS text; an empty one would end every answer before it began.
            response = formatter(**kwargs)
            response.stop = None
            return response

        return format_without_empty_stop

    chat_format.Jinja2ChatFormatter.__call__ = format_with_render_prompt
    chat_format.hf_tokenizer_config_to_chat_formatter = template_file_formatter
    chat_format._toolpair_templates = True


def take_template_kwargs_per_request() -> None:
    """Have the engine take ``chat_template_kwargs`` in each chat request, as llama-server does.

    llama-cpp-python reads them only once, from its settings at model load, and drops the
    field from a request; so a client's (or toolpair's, :mod:`proxy.engine.thinking`) thinking
    switch, ``enable_thinking``, never reached the template. Here the request model gains the
    field, and the chat call keeps it aside for the length of the call (the prompt is formatted
    inside it, for streams too), where the formatter of :func:`render_chat_templates_as_models_expect`
    hands it to the template; the request's keys win over the load-time ones. Call before the
    server module is imported.
    """
    types: Any = importlib.import_module("llama_cpp.server.types")
    llama: Any = importlib.import_module("llama_cpp.llama")
    pydantic: Any = importlib.import_module("pydantic")  # the engine's dependency, not toolpair's
    if getattr(types, "_toolpair_template_kwargs", False):
        return
    request_model = types.CreateChatCompletionRequest
    with_kwargs = pydantic.create_model(
        request_model.__name__,
        __base__=request_model,
        chat_template_kwargs=(dict[str, Any] | None, None),
    )
    with_kwargs.__doc__ = request_model.__doc__
    create = llama.Llama.create_chat_completion

    def create_with_template_kwargs(self: Any, *args: Any, chat_template_kwargs: Any = None, **kwargs: Any) -> Any:
        token = _REQUEST_TEMPLATE_KWARGS.set(chat_template_kwargs or None)
        try:
            return create(self, *args, **kwargs)
        finally:
            _REQUEST_TEMPLATE_KWARGS.reset(token)

    types.CreateChatCompletionRequest = with_kwargs
    llama.Llama.create_chat_completion = create_with_template_kwargs
    types._toolpair_template_kwargs = True


def write_control_tokens_as_text() -> None:
    """Have the engine's completions spell out the control tokens the model writes, as its template does.

    llama-cpp-python turns a completion's tokens into text without their special pieces,
    so a control token comes back as nothing. Most call and reasoning markers are control tokens
    in a GGUF: the conversion marks every ``<|...|>`` token (and DeepSeek's fullwidth-bar ones), and every
    token the tokenizer calls special, as one (gpt-oss's ``<|channel|>``, DeepSeek's tool-calls
    section token, Kimi's ``<|tool_calls_section_begin|>``, LFM2's
    ``<|tool_call_start|>``). Dropped, a call is left as bare arguments in the content, and
    toolpair's readers (:mod:`proxy.engine.toolcalls`) never see where it starts. The completion
    path detokenizes with ``prev_tokens``; there the pieces are kept. The end-of-generation token
    that stops a reply is never part of its text either way, and ``/extras/detokenize`` (no
    ``prev_tokens``) is unchanged. llama-server keeps the markers of the format it parses
    (its preserved tokens) for the same reason. Call before the server module is imported.
    """
    llama: Any = importlib.import_module("llama_cpp.llama")
    if getattr(llama.Llama, "_toolpair_control_tokens", False):
        return
    detokenize = llama.Llama.detokenize

    def detokenize_completions_with_control_tokens(
        self: Any, tokens: Any, prev_tokens: Any = None, special: bool = False
    ) -> bytes:
        return bytes(detokenize(self, tokens, prev_tokens=prev_tokens, special=special or prev_tokens is not None))

    llama.Llama.detokenize = detokenize_completions_with_control_tokens
    llama.Llama._toolpair_control_tokens = True


def extra_buffer_types() -> list[str]:
    """The names of the CPU backend's extra weight buffer types in the loaded ggml (``AMX``, ``CPU_REPACK``, ...).

    ggml lists AMX only when it was compiled in and this CPU has AMX, so its
    presence alone says the crash below can happen here.
    """
    ggml: Any = importlib.import_module("llama_cpp._ggml").libggml
    ggml.ggml_backend_dev_by_type.restype, ggml.ggml_backend_dev_by_type.argtypes = ctypes.c_void_p, [ctypes.c_int]
    ggml.ggml_backend_dev_backend_reg.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_backend_reg.argtypes = [ctypes.c_void_p]
    get_proc = ggml.ggml_backend_reg_get_proc_address
    get_proc.restype, get_proc.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_char_p]
    ggml.ggml_backend_buft_name.restype, ggml.ggml_backend_buft_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    device = ggml.ggml_backend_dev_by_type(0)  # GGML_BACKEND_DEVICE_TYPE_CPU
    if not device:
        return []
    address = get_proc(ggml.ggml_backend_dev_backend_reg(device), b"ggml_backend_dev_get_extra_bufts")
    if not address:
        return []
    listing = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(address)(device)
    names: list[str] = []
    while listing and listing[len(names)]:
        names.append(ggml.ggml_backend_buft_name(listing[len(names)]).decode())
    return names


def load_without_extra_buffers() -> None:
    """Make every model this process loads keep its weights in plain CPU buffers (``use_extra_bufts = false``)."""
    api: Any = importlib.import_module("llama_cpp.llama_cpp")
    defaults = api.llama_model_default_params

    def without_extra_buffers() -> Any:
        params = defaults()
        params.use_extra_bufts = False
        return params

    api.llama_model_default_params = without_extra_buffers


def keep_weights_off_amx(keep_amx: bool = False, buffer_types: Callable[[], list[str]] = extra_buffer_types) -> bool:
    """Load weights without extra buffer types where llama.cpp would put them in AMX; True when it did.

    llama.cpp repacks weights into its AMX buffer on CPUs with AMX, and the first
    matrix multiply there segfaults (llama.cpp #20824). toolpair's own builds
    leave AMX out (see ``engine_launcher.builder.backends.NO_AMX_FLAGS``); this covers an
    engine built elsewhere with it in. ``use_extra_bufts = false`` is the one
    switch llama.cpp offers, and it also turns off the other repacked CPU
    kernels, so it is used only where AMX is present. ``keep_amx`` (``--amx``, which the
    launcher passes when the ``engine_amx`` setting is on) keeps AMX, for a llama.cpp that has fixed it.
    """
    if keep_amx or "AMX" not in buffer_types():
        return False
    load_without_extra_buffers()
    print(
        "toolpair: this CPU has AMX and this engine was built with llama.cpp's AMX weight path, which crashes "
        f"(llama.cpp #20824): loading the weights without it ({AMX_SETTING}=1 keeps it)",
        file=sys.stderr,
        flush=True,
    )
    return True


@dataclass(frozen=True)
class EngineFix:
    """One change toolpair makes inside llama-cpp-python, and how to tell it is still needed."""

    apply: Callable[[bool], object]
    """Makes the change in this process; given the ``--amx`` choice (only the AMX row reads it)."""
    changes: str
    """What of llama-cpp-python's (and llama.cpp's) it replaces or reads, private names included."""
    why: str
    test: str
    """The test that fails without it (``path::name``)."""
    checked_against: str = LLAMA_CPP_VERSION
    """The llama-cpp-python release the change was read against."""


ENGINE_FIXES: tuple[EngineFix, ...] = (
    EngineFix(
        lambda keep_amx: bound_prompt_cache(),
        "Llama.save_state, Llama.load_state (Llama._logits_all, Llama.scores), LlamaRAMCache.cache_size",
        "the RAM prompt cache holds many times its cache_size in unused logits rows",
        "tests/engine_launcher/test_engine_tuning.py::test_a_saved_state_holds_one_logits_row_and_the_cache_counts_all_it_holds",
    ),
    EngineFix(
        lambda keep_amx: render_chat_templates_as_models_expect(),
        "Jinja2ChatFormatter.__call__ (its template, bos_token, eos_token, add_generation_prompt, stop_token_ids; "
        "ChatFormatterResponse, llama.StoppingCriteriaList), hf_tokenizer_config_to_chat_formatter",
        "the engine would read other prompts than check-template and count_tokens show: arguments as strings, "
        "a template file without a generation prompt, no Kimi K2 (its template builds its own lists)",
        "tests/engine_launcher/test_engine_renderer.py::test_the_engines_formatter_reads_render_prompts_prompt",
    ),
    EngineFix(
        lambda keep_amx: take_template_kwargs_per_request(),
        "server.types.CreateChatCompletionRequest, Llama.create_chat_completion (read by the formatter above)",
        "a request's chat_template_kwargs (enable_thinking) never reach the template",
        "tests/test_serve_templates.py::test_anthropic_thinking_turns_the_templates_switch_and_count_tokens_follows",
    ),
    EngineFix(
        lambda keep_amx: write_control_tokens_as_text(),
        "Llama.detokenize",
        "call and reasoning markers that are control tokens vanish from completions",
        "tests/engine/test_engine_real.py::test_control_tokens_the_model_writes_reach_the_reply_as_text",
    ),
    EngineFix(
        keep_weights_off_amx,
        "llama_model_default_params (use_extra_bufts); ggml_backend_dev_get_extra_bufts through ctypes",
        "llama.cpp's AMX weight path segfaults at the first matrix multiply (llama.cpp #20824)",
        "tests/engine_launcher/test_cpu_build.py::test_amx_weights_are_kept_off_only_where_ggml_has_them",
    ),
)
"""Every change toolpair makes inside llama-cpp-python, in the order :func:`main` applies them."""


def main() -> None:
    keep_amx = len(sys.argv) > 1 and sys.argv[1] == "--amx"
    args = sys.argv[2:] if keep_amx else sys.argv[1:]
    if not args:
        sys.exit("usage: python -m engine_launcher.inside.engine_main [--amx] MODULE [ARGS...]")
    module = args[0]
    sys.argv = [module, *args[1:]]
    for fix in ENGINE_FIXES:
        fix.apply(keep_amx)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
