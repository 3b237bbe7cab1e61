"""``toolpair serve``: its flags (llama-server's names for the engine's), its settings, and its start."""

from __future__ import annotations

import argparse
import asyncio

from engine_launcher.supervise.launch import CACHE_TYPES, SPLIT_MODES
from proxy.cli.common import (
    Subcommands,
    add_listen_options,
    add_store_options,
    comma_list,
    command_settings,
    new_event_loop,
    positive,
    start_logging,
)
from proxy.config import Settings
from proxy.serve import check_engine, run_serve
from proxy.serve_plan import plan_serve

__all__ = ["SERVE_ENGINE_SETTINGS", "add_parser", "serve_settings"]


def add_parser(commands: Subcommands) -> None:
    serve = commands.add_parser(
        "serve",
        help="run llama-cpp-python and toolpair in front of it",
        description=(
            "Start llama-cpp-python with MODEL (default: the bundled Gemma 3 270M) on a private "
            "loopback port and serve it through toolpair. Install the engine first with "
            "`toolpair engine install`."
        ),
    )
    _add_serve_engine_options(serve)
    serve.add_argument_group("llama.cpp RPC").add_argument(
        "--rpc",
        dest="engine_rpc",
        metavar="HOST:PORT,...",
        type=comma_list,
        help="split the model across these `toolpair rpc-worker`s (also TOOLPAIR_ENGINE_RPC); see docs/rpc.md",
    )
    parallel = serve.add_argument_group("parallel engines")
    parallel.add_argument(
        "--parallel",
        dest="engine_parallel",
        type=positive,
        metavar="N",
        help="run N engines of the model side by side, N times the memory; each gets 1/N of the cores "
        "unless -t/-tb say otherwise (default 1; see docs/parallel.md)",
    )
    listening = serve.add_argument_group("listening, logging and the Responses store")
    add_store_options(listening)
    add_listen_options(listening)
    serve.add_argument(
        "--check",
        action="store_true",
        help="start the engine as serve would, have it generate a few tokens, say how that went and exit "
        "(0: it generated; 1: it could not, and why)",
    )
    serve.set_defaults(run=_run_serve)


def _size(text: str) -> int:
    """A byte count: 1073741824, 1G, 1GiB, 512M, 0.

    >>> _size("1GiB"), _size("512m"), _size("0")
    (1073741824, 536870912, 0)
    """
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(cleaned[-1:], 1)
    number = cleaned[:-1] if scale > 1 else cleaned
    try:
        value = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or e.g. 512M, 2G)") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"a size cannot be negative: {text!r}")
    return int(value * scale)


def _shares(text: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r} (e.g. 3,1)") from None


_FLASH_ATTN = {"on": True, "off": False, "auto": None}


def _flash_attn(text: str) -> str:
    if text not in _FLASH_ATTN:
        raise argparse.ArgumentTypeError(f"must be on, off or auto, not {text!r}")
    return text


# serve's flags for the engine, with llama-server's names; each is also a setting (YAML, TOOLPAIR_*).
SERVE_ENGINE_SETTINGS = (
    "model",
    "engine_ctx_size",
    "chat_template",
    "engine_logprobs",
    "prompt_cache_size",
    "engine_threads",
    "engine_threads_batch",
    "engine_batch_size",
    "engine_ubatch_size",
    "engine_flash_attn",
    "engine_cache_type_k",
    "engine_cache_type_v",
    "engine_mlock",
    "engine_mmap",
    "engine_gpu_layers",
    "engine_main_gpu",
    "engine_split_mode",
    "engine_tensor_split",
    "engine_args",
)


def _add_serve_engine_options(serve: argparse.ArgumentParser) -> None:
    model = serve.add_argument_group("model, context and memory")
    model.add_argument("--model", metavar="PATH", help="GGUF model file (default: the bundled model)")
    model.add_argument(
        "-c",
        "--ctx-size",
        dest="engine_ctx_size",
        type=positive,
        metavar="N",
        help="context size (default: the model's training context, smaller if memory is short)",
    )
    model.add_argument(
        "--chat-template-file",
        dest="chat_template",
        metavar="FILE",
        help="tokenizer_config-style JSON with the chat template (default: the model's own)",
    )
    model.add_argument(
        "--logprobs",
        dest="engine_logprobs",
        action="store_const",
        const=True,
        help="serve logprobs (costs n_ctx x vocabulary x 4 bytes of memory; off: such requests get 400)",
    )
    model.add_argument(
        "--prompt-cache-size",
        dest="prompt_cache_size",
        type=_size,
        metavar="BYTES",
        help="RAM prompt cache for recent conversations, e.g. 2G (default 1G; 0 turns it off)",
    )
    cpu = serve.add_argument_group("threads, batches and KV cache")
    cpu.add_argument(
        "-t", "--threads", dest="engine_threads", type=positive, metavar="N", help="default: physical cores"
    )
    cpu.add_argument(
        "-tb", "--threads-batch", dest="engine_threads_batch", type=positive, metavar="N", help="default: every core"
    )
    cpu.add_argument("-b", "--batch-size", dest="engine_batch_size", type=positive, metavar="N", help="default 512")
    cpu.add_argument("-ub", "--ubatch-size", dest="engine_ubatch_size", type=positive, metavar="N", help="default 512")
    cpu.add_argument(
        "-fa",
        "--flash-attn",
        dest="engine_flash_attn",
        type=_flash_attn,
        nargs="?",
        const="on",
        metavar="on|off|auto",
        help="flash attention (bare -fa: on; default: the engine's, off)",
    )
    for which in ("k", "v"):
        cpu.add_argument(
            f"--cache-type-{which}",
            dest=f"engine_cache_type_{which}",
            choices=list(CACHE_TYPES),
            metavar="TYPE",
            help=f"KV cache type for {which.upper()}: {', '.join(CACHE_TYPES)} (default f16)",
        )
    cpu.add_argument("--mlock", dest="engine_mlock", action="store_const", const=True, help="lock the model in RAM")
    cpu.add_argument(
        "--no-mmap", dest="engine_mmap", action="store_const", const=False, help="read the model instead of mapping it"
    )
    gpu = serve.add_argument_group("GPU")
    gpu.add_argument(
        "-ngl",
        "--n-gpu-layers",
        "--gpu-layers",
        dest="engine_gpu_layers",
        type=int,
        metavar="N",
        help="layers on the GPU, -1 all (default: all on a GPU build)",
    )
    gpu.add_argument("--main-gpu", dest="engine_main_gpu", type=int, metavar="I", help="GPU for the model (default 0)")
    gpu.add_argument("--split-mode", dest="engine_split_mode", choices=list(SPLIT_MODES), help="across GPUs")
    gpu.add_argument(
        "--tensor-split", dest="engine_tensor_split", type=_shares, metavar="N,N,...", help="shares per GPU, e.g. 3,1"
    )
    other = serve.add_argument_group("any other llama-cpp-python server setting")
    other.add_argument(
        "--engine-arg",
        dest="engine_args",
        action="append",
        metavar="KEY=VALUE",
        help="passed as --KEY VALUE, checked against the installed engine's settings (repeatable)",
    )


def serve_settings(args: argparse.Namespace) -> Settings:
    """serve's settings: its flags over TOOLPAIR_* variables over the config file over defaults."""
    if isinstance(args.engine_flash_attn, str):
        args.engine_flash_attn = _FLASH_ATTN[args.engine_flash_attn]  # auto: None, the engine's default
    return command_settings(args, "responses_store", *SERVE_ENGINE_SETTINGS, "engine_parallel", "engine_rpc")


def _run_serve(args: argparse.Namespace) -> int:
    settings = serve_settings(args)
    start_logging(settings)
    plan = plan_serve(settings)
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        if args.check:
            return runner.run(check_engine(settings, plan))
        return runner.run(run_serve(settings, plan))
