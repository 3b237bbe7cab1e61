"""How llama-cpp-python's server is started: the one place its command line is built.

The engine listens on loopback only, on a port chosen once, and requires its
own random key, so only toolpair can reach it. ``interrupt_requests`` is off,
so a new request never cuts off a running stream (toolpair queues instead).

The key travels in the child's environment (``API_KEY``), not on its command
line, where any local user could read it with ``ps``. The server's settings
class reads every field from the environment as well as the command line,
case-insensitively, so inherited variables such as ``PORT``, ``HOST``,
``MODEL`` or ``N_CTX`` would silently override ours; :func:`engine_env` drops
them.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["READY_PATH", "EngineLaunch", "engine_command", "engine_env", "free_port", "SERVER_SETTING_NAMES"]

READY_PATH = "/docs"
"""Answered by the server without its model lock or a key, and only once the
model is loaded (the model loads before the server starts listening)."""

# Fields of llama_cpp.server.settings.Settings and ConfigFileSettings (0.3.36),
# each of which the server would also read from an environment variable of the
# same name; a test keeps this list in step with the installed package.
SERVER_SETTING_NAMES = frozenset(
    {
        "api_key",
        "cache",
        "cache_size",
        "cache_type",
        "chat_format",
        "chat_template_kwargs",
        "clip_model_path",
        "disable_ping_events",
        "draft_model",
        "draft_model_num_pred_tokens",
        "embedding",
        "flash_attn",
        "hf_model_repo_id",
        "hf_pretrained_model_name_or_path",
        "hf_tokenizer_config_path",
        "host",
        "interrupt_requests",
        "kv_overrides",
        "last_n_tokens_size",
        "logits_all",
        "lora_base",
        "lora_path",
        "main_gpu",
        "model",
        "model_alias",
        "models",
        "mul_mat_q",
        "n_batch",
        "n_ctx",
        "n_gpu_layers",
        "n_threads",
        "n_threads_batch",
        "n_ubatch",
        "numa",
        "offload_kqv",
        "port",
        "root_path",
        "rope_freq_base",
        "rope_freq_scale",
        "rope_scaling_type",
        "rpc_servers",
        "seed",
        "split_mode",
        "ssl_certfile",
        "ssl_keyfile",
        "tensor_split",
        "type_k",
        "type_v",
        "use_mlock",
        "use_mmap",
        "verbose",
        "vocab_only",
        "yarn_attn_factor",
        "yarn_beta_fast",
        "yarn_beta_slow",
        "yarn_ext_factor",
        "yarn_orig_ctx",
        "config_file",
    }
)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class EngineLaunch:
    """Everything that decides how the engine process is started."""

    model: Path
    port: int
    api_key: str
    n_ctx: int
    n_gpu_layers: int = 0
    chat_template: Path | None = None
    host: str = "127.0.0.1"
    python: str = field(default=sys.executable)
    rpc_servers: tuple[str, ...] = ()
    """llama.cpp RPC workers (HOST:PORT) to split the model across; see engine_launcher/rpc.py."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def engine_command(launch: EngineLaunch) -> list[str]:
    """The argv that starts llama-cpp-python's OpenAI-compatible server.

    >>> launch = EngineLaunch(Path("m.gguf"), 8001, "k", 4096, python="python")
    >>> engine_command(launch)[:4]
    ['python', '-m', 'llama_cpp.server', '--model']
    """
    command = [
        # llama_cpp.server ignores rpc_servers; engine_launcher.rpc registers the workers, then runs it.
        launch.python, "-m", "engine_launcher.rpc" if launch.rpc_servers else "llama_cpp.server",
        "--model", str(launch.model),
        "--host", launch.host,
        "--port", str(launch.port),
        "--n_ctx", str(launch.n_ctx),
        "--n_gpu_layers", str(launch.n_gpu_layers),
        "--interrupt_requests", "False",
    ]  # fmt: skip
    if launch.chat_template is not None:
        command += ["--chat_format", "hf-tokenizer-config", "--hf_tokenizer_config_path", str(launch.chat_template)]
    if launch.rpc_servers:
        command += ["--rpc_servers", ",".join(launch.rpc_servers)]
    return command


def engine_env(launch: EngineLaunch, base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: ours, less anything the server would read as a setting, plus its key.

    >>> sorted(engine_env(EngineLaunch(Path("m"), 1, "k", 8), {"PORT": "80", "PATH": "/bin"}))
    ['API_KEY', 'PATH', 'PYTHONUNBUFFERED']
    """
    env = {k: v for k, v in base.items() if k.lower() not in SERVER_SETTING_NAMES}
    env["API_KEY"] = launch.api_key
    env["PYTHONUNBUFFERED"] = "1"  # its log lines reach us as they happen
    return env
