"""``toolpair check-template``: whether a chat template ties tool results to their calls, or only to their place."""

from __future__ import annotations

import argparse
import logging
import textwrap

from engine_launcher.builder.gguf import GGUFError
from engine_launcher.builder.gguf import chat_template as gguf_chat_template
from engine_launcher.builder.models import ModelError, serve_model
from engine_launcher.templates.template_check import (
    Renderer,
    TemplateSource,
    check_template,
    headline,
    meaning,
    template_from_file_text,
)
from proxy.cli.common import Subcommands, read_template_file
from proxy.config import ConfigError, Settings, load_settings
from proxy.engine.template_readback import read_back

__all__ = ["add_parser"]


def add_parser(commands: Subcommands) -> None:
    check = commands.add_parser(
        "check-template",
        help="say whether a model's chat template pairs tool results with calls by position only",
        description=(
            "Render the chat template with one assistant turn that calls the same tool twice in parallel, "
            "with the two results in call order and reversed, and say whether only their position ties "
            "results to calls (exit 1: keep toolpair in front), an ID does or the template orders them "
            "itself (exit 0), or the template cannot render parallel calls or fails (exit 2). Default: "
            "the template `toolpair serve` would use (the model's own, or the configured chat_template, "
            "or the ChatML fallback for a model without one)."
        ),
    )
    which = check.add_mutually_exclusive_group()
    which.add_argument("--model", metavar="FILE.gguf", help="the GGUF model whose template to check")
    which.add_argument(
        "--template", metavar="FILE", help="a Jinja template, or a tokenizer_config-style JSON with chat_template"
    )
    check.add_argument(
        "--renderer",
        choices=[r.value for r in Renderer],
        default=Renderer.LLAMA_CPP_PYTHON.value,
        help="render as llama-cpp-python (toolpair serve's engine; default) or as transformers "
        "(vLLM; llama-server --jinja follows its dialect)",
    )
    check.add_argument("--config", metavar="FILE", help="YAML settings file (also TOOLPAIR_CONFIG)")
    check.set_defaults(run=_run_check_template)


def _serve_template(settings: Settings) -> TemplateSource:
    """The template ``toolpair serve`` would hand the engine for these settings, read from its file."""
    try:
        served = serve_model(settings.model, settings.chat_template)
    except (ModelError, GGUFError) as exc:
        raise ConfigError(str(exc)) from None
    chosen = served.template
    if chosen.path is None:
        text = gguf_chat_template(served.metadata)
        assert text is not None  # no file is chosen only for a model with a template
        return TemplateSource(text, origin=f"the chat template in {served.path.name}")
    if settings.chat_template:
        origin = f"{chosen.path} (chat_template setting)"
    else:
        origin = f"{chosen.path.name}, toolpair serve's template for {served.path.name}: {chosen.reason}"
    return template_from_file_text(chosen.path.read_text(encoding="utf-8"), origin)


def _run_check_template(args: argparse.Namespace) -> int:
    if args.template:
        source = read_template_file(args.template)
    else:
        source = _serve_template(load_settings({"model": args.model}, config_file=args.config))
    renderer = Renderer(args.renderer)
    verdict = check_template(source, renderer)
    print(f"template: {source.origin}")
    print(f"rendered the way {renderer.value} renders it, with one tool called twice in parallel")
    print(f"verdict: {verdict.pairing.value}: {headline(verdict.pairing)}")
    if verdict.detail:
        print(f"  the template says: {verdict.detail}")
    print(_wrapped(meaning(verdict.pairing)))
    logging.getLogger("toolpair.toolcalls").setLevel(logging.ERROR)  # the line below says how the calls fared
    print(read_back(source, renderer).line())
    return verdict.exit_status


def _wrapped(text: str) -> str:
    return textwrap.fill(text, width=100, initial_indent="  ", subsequent_indent="  ")
