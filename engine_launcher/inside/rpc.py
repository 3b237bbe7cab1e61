"""llama.cpp RPC: one model split across ``toolpair rpc-worker`` processes on other machines.

llama-cpp-python 0.3.36 still accepts ``rpc_servers`` but drops it: llama.cpp
moved RPC servers out of the model parameters and into ggml's device registry.
So when ``serve --rpc`` is given, the engine starts through this module
(``python -m engine_launcher.inside.rpc`` with llama_cpp.server's own arguments): it
checks that every worker answers, registers each one as ggml devices, then
runs ``llama_cpp.server`` unchanged in the same process. The model loader then
sees the workers as GPU devices and splits the offloaded layers across them
by their free memory; its log names each remote buffer (``RPC0[host:port]
model buffer size = ...``).

A worker that is down when the engine starts ends the engine with one line
naming it and how to start it. A worker that dies while the engine runs makes
llama.cpp abort the engine (it has no way to carry on without the layers that
worker held); toolpair's supervisor then answers the requests in flight with
its engine-unavailable error and restarts the engine, which comes back as soon
as the worker does.

RPC has no authentication and no encryption: workers must sit on a private
network that only the engine's machine can reach.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import socket
import sys
from collections.abc import Iterable, Sequence

__all__ = ["DEFAULT_PORT", "RPC_ARG", "WILDCARD_HOSTS", "parse_endpoints", "split_endpoint", "unreachable"]

DEFAULT_PORT = 50052
"""rpc-server's own default."""
RPC_ARG = "--rpc_servers"
"""llama_cpp.server's setting; it parses (and ignores) it, this module acts on it."""
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", "[::]", "*", ""})
_CONNECT_TIMEOUT = 5.0


def split_endpoint(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6) as (host, port); ValueError when it is not one.

    >>> split_endpoint("10.0.0.5:50052"), split_endpoint("[fd00::5]:50052")
    (('10.0.0.5', 50052), ('fd00::5', 50052))
    """
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or (":" in host and "[" not in text):
        raise ValueError(f"RPC worker {text!r} is not HOST:PORT (IPv6 as [ADDRESS]:PORT)")
    return host, int(port)


def parse_endpoints(values: Iterable[str]) -> tuple[str, ...]:
    """Workers from settings or ``--rpc`` (each item may hold several, comma separated), checked, in order.

    >>> parse_endpoints(["10.0.0.5:50052,10.0.0.6:50052"])
    ('10.0.0.5:50052', '10.0.0.6:50052')
    """
    endpoints: list[str] = []
    for value in values:
        for item in value.split(","):
            if item.strip():
                split_endpoint(item)
                if item.strip() in endpoints:
                    raise ValueError(f"RPC worker {item.strip()} is listed twice")
                endpoints.append(item.strip())
    return tuple(endpoints)


def unreachable(endpoints: Sequence[str], timeout: float = _CONNECT_TIMEOUT) -> list[str]:
    """One line for each worker that does not accept a connection."""
    problems = []
    for endpoint in endpoints:
        host, port = split_endpoint(endpoint)
        try:
            with socket.create_connection((host, port), timeout=timeout):
                pass
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            problems.append(
                f"RPC worker {endpoint} is not reachable ({reason}); start it on that machine with "
                f"`toolpair rpc-worker --host {host} --port {port}` (see docs/rpc.md)"
            )
    return problems


def _register(endpoints: Sequence[str]) -> list[str]:
    """Add each worker's devices to ggml's registry, as llama.cpp's own ``--rpc`` does."""
    # Through libllama's handle: dlsym searches libllama and then the libraries it links, so these are the
    # functions of the very ggml (and registry) the model loader uses. Loading libggml by its path would
    # map a second copy (the wheel holds copies, not symlinks) with a registry of its own.
    from llama_cpp.llama_cpp import _lib as ggml  # type: ignore[import-not-found,import-untyped,unused-ignore]

    ggml.ggml_backend_reg_by_name.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_by_name.argtypes = [ctypes.c_char_p]
    ggml.ggml_backend_reg_get_proc_address.restype = ctypes.c_void_p
    ggml.ggml_backend_reg_get_proc_address.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    ggml.ggml_backend_register.restype = None
    ggml.ggml_backend_register.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_reg_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_reg_dev_count.argtypes = [ctypes.c_void_p]
    rpc = ggml.ggml_backend_reg_by_name(b"RPC")
    address = ggml.ggml_backend_reg_get_proc_address(rpc, b"ggml_backend_rpc_add_server") if rpc else None
    if not address:
        raise RuntimeError("this engine was built without RPC: run `toolpair engine install --rebuild`")
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    added = []
    for endpoint in endpoints:
        reg = add_server(endpoint.encode())
        if not reg:
            raise RuntimeError(f"RPC worker {endpoint} offers no devices")
        ggml.ggml_backend_register(reg)
        added.append(f"{endpoint} ({ggml.ggml_backend_reg_dev_count(reg)} device(s))")
    return added


def _endpoints_in(argv: Sequence[str]) -> tuple[str, ...]:
    values = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == RPC_ARG]
    return parse_endpoints(values)


def main(argv: Sequence[str]) -> int:
    """Check and register the workers named by ``--rpc_servers``, then run llama_cpp.server with ``argv``."""
    try:
        endpoints = _endpoints_in(argv)
    except ValueError as exc:
        print(f"toolpair engine: {exc}", file=sys.stderr, flush=True)
        return 2
    problems = unreachable(endpoints)
    if problems:
        for line in problems:
            print(f"toolpair engine: {line}", file=sys.stderr, flush=True)
        return 3
    # When a worker goes away, ggml aborts; without this it first runs gdb for a backtrace.
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    try:
        added = _register(endpoints)
    except RuntimeError as exc:
        print(f"toolpair engine: {exc}", file=sys.stderr, flush=True)
        return 3
    print(f"toolpair engine: RPC workers registered: {', '.join(added)}", file=sys.stderr, flush=True)
    sys.argv = ["llama_cpp.server", *argv]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":  # pragma: no cover - the engine process
    sys.exit(main(sys.argv[1:]))
