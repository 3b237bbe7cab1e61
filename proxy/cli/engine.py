"""``toolpair engine install`` and ``toolpair engine detect``: building the managed engine for this machine."""

from __future__ import annotations

import argparse
import os
import sys

from engine_launcher.builder.backends import BACKEND_CHOICES, build_plan, detect_backend
from engine_launcher.builder.install import InstallError, install_engine
from engine_launcher.builder.machine import this_machine
from proxy.cli.common import Subcommands
from proxy.config import load_settings

__all__ = ["add_parser"]


def add_parser(commands: Subcommands) -> None:
    engine = commands.add_parser("engine", help="build and install the managed engine")
    engine_commands = engine.add_subparsers(dest="engine_command", metavar="ACTION", required=True)
    install = engine_commands.add_parser(
        "install",
        help="build llama-cpp-python for a backend and install it here",
        description=(
            "Build llama-cpp-python for BACKEND (auto: detect this machine's), cache the wheel under "
            "$TOOLPAIR_CACHE/wheels/BACKEND, install it into this Python environment and verify it. "
            "Extra CMake flags come from CMAKE_ARGS."
        ),
    )
    install.add_argument("--backend", choices=BACKEND_CHOICES, help="default: engine_backend setting (auto)")
    install.add_argument("--rebuild", action="store_true", help="build again even if a cached wheel fits")
    install.add_argument(
        "--portable",
        action="store_true",
        default=None,
        help="build for llama.cpp's baseline CPU (x86-64-v3) instead of this one, to run elsewhere "
        "(also TOOLPAIR_ENGINE_PORTABLE=1)",
    )
    install.add_argument(
        "--amx",
        action="store_true",
        default=None,
        help="keep llama.cpp's AMX weight path, left out by default since it crashes (llama.cpp #20824; "
        "also TOOLPAIR_ENGINE_AMX=1)",
    )
    install.add_argument("--config", metavar="FILE", help="YAML settings file (also TOOLPAIR_CONFIG)")
    detect = engine_commands.add_parser("detect", help="show the backend this machine would get, and why")
    detect.add_argument("--config", metavar="FILE", help="YAML settings file (also TOOLPAIR_CONFIG)")
    for action in (install, detect):
        action.set_defaults(run=_run_engine)


def _run_engine(args: argparse.Namespace) -> int:
    settings = load_settings({"engine_backend": getattr(args, "backend", None)}, config_file=args.config)
    if args.engine_command == "detect":
        machine = this_machine()
        found = detect_backend(os.environ, machine, explicit=settings.engine_backend)
        plan = build_plan(found, os.environ, machine.probes, amx=settings.engine_amx)
        print(f"backend: {found.backend.value}\nreason: {found.reason}")
        print(f"CMAKE_ARGS: {plan.env.get('CMAKE_ARGS', '')}")
        for problem in plan.problems:
            print(f"warning: {problem}")
        return 0
    try:
        amx = bool(args.amx) or settings.engine_amx
        install_engine(settings.engine_backend, rebuild=args.rebuild, portable=args.portable, amx=amx)
    except (InstallError, ValueError) as exc:
        print(f"toolpair: {exc}", file=sys.stderr)
        return 1
    return 0
