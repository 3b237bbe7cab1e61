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

``logits_all`` is off unless asked for: the server's own default (on) makes
llama-cpp-python allocate n_ctx x n_vocab float32 scores, 32 GiB at n_ctx 32768
for a 262,144-token vocabulary, only to serve logprobs.
"""

from __future__ import annotations

import ast
import importlib.util
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engine_launcher.builder.backends import child_env

__all__ = [
    "CACHE_TYPES",
    "READY_PATH",
    "SERVER_SETTING_NAMES",
    "SPLIT_MODES",
    "EngineLaunch",
    "child_env",
    "engine_command",
    "engine_env",
    "free_port",
    "installed_setting_names",
]

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


# KV cache types by llama-server's names (--cache-type-k/-v), as ggml type numbers, which is
# what llama-cpp-python's type_k and type_v take; and the bytes one element takes.
CACHE_TYPES: dict[str, tuple[int, float]] = {
    "f32": (0, 4.0),
    "f16": (1, 2.0),
    "q4_0": (2, 18 / 32),
    "q4_1": (3, 20 / 32),
    "q5_0": (6, 22 / 32),
    "q5_1": (7, 24 / 32),
    "q8_0": (8, 34 / 32),
    "iq4_nl": (20, 18 / 32),
    "bf16": (30, 2.0),
}

# --split-mode names, as llama_split_mode numbers.
SPLIT_MODES = {"none": 0, "layer": 1, "row": 2}


def installed_setting_names() -> frozenset[str]:
    """The settings the installed llama-cpp-python server accepts, read from its source.

    Read with ``ast`` rather than imported, so asking costs no shared-library
    load; :data:`SERVER_SETTING_NAMES` answers when the engine is not installed
    or its source has an unexpected shape.
    """
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return SERVER_SETTING_NAMES
    source = Path(next(iter(spec.submodule_search_locations))) / "server" / "settings.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return SERVER_SETTING_NAMES
    names = {"config_file"}  # read by the server's command line, not a settings field
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.endswith("Settings"):
            names.update(
                item.target.id
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            )
    return frozenset(names) if "model" in names and "n_ctx" in names else SERVER_SETTING_NAMES


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
    """llama.cpp RPC workers (HOST:PORT) to split the model across; see engine_launcher/inside/rpc.py."""
    logits_all: bool = False
    """Keep every token's logits, so logprobs can be served (n_ctx x n_vocab x 4 bytes)."""
    prompt_cache_bytes: int = 0
    """Size of the engine's RAM prompt cache; 0 turns it off."""
    n_threads: int | None = None
    n_threads_batch: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    flash_attn: bool | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    use_mlock: bool | None = None
    use_mmap: bool | None = None
    main_gpu: int | None = None
    split_mode: str | None = None
    tensor_split: tuple[float, ...] = ()
    extra: Mapping[str, str] = field(default_factory=dict)
    """Any other server setting (``--engine-arg KEY=VALUE``), passed as ``--KEY VALUE``."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Set in the engine's environment: its device choice, its build's run-time libraries (see :func:`child_env`)."""
    amx: bool = False
    """Load weights into llama.cpp's AMX buffer (``engine_amx``); otherwise the engine keeps them off it."""

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def engine_command(launch: EngineLaunch) -> list[str]:
    """The argv that starts llama-cpp-python's OpenAI-compatible server.

    It runs through :mod:`engine_launcher.inside.engine_main`, which bounds the
    server's prompt cache by what it really holds.

    >>> launch = EngineLaunch(Path("m.gguf"), 8001, "k", 4096, python="python")
    >>> engine_command(launch)[:5]
    ['python', '-m', 'engine_launcher.inside.engine_main', 'llama_cpp.server', '--model']
    """
    command = [
        # llama_cpp.server ignores rpc_servers; engine_launcher.inside.rpc registers the workers, then runs it.
        launch.python, "-m", "engine_launcher.inside.engine_main", *(["--amx"] if launch.amx else []),
        "engine_launcher.inside.rpc" if launch.rpc_servers else "llama_cpp.server",
        "--model", str(launch.model),
        "--host", launch.host,
        "--port", str(launch.port),
        "--n_ctx", str(launch.n_ctx),
        "--n_gpu_layers", str(launch.n_gpu_layers),
        "--interrupt_requests", "False",
        "--logits_all", str(launch.logits_all),
    ]  # fmt: skip
    if launch.chat_template is not None:
        command += ["--chat_format", "hf-tokenizer-config", "--hf_tokenizer_config_path", str(launch.chat_template)]
    if launch.prompt_cache_bytes > 0:
        command += ["--cache", "True", "--cache_type", "ram", "--cache_size", str(launch.prompt_cache_bytes)]
    knobs: dict[str, object] = {
        "n_threads": launch.n_threads,
        "n_threads_batch": launch.n_threads_batch,
        "n_batch": launch.n_batch,
        "n_ubatch": launch.n_ubatch,
        "flash_attn": launch.flash_attn,
        "type_k": CACHE_TYPES[launch.cache_type_k][0] if launch.cache_type_k else None,
        "type_v": CACHE_TYPES[launch.cache_type_v][0] if launch.cache_type_v else None,
        "use_mlock": launch.use_mlock,
        "use_mmap": launch.use_mmap,
        "main_gpu": launch.main_gpu,
        "split_mode": SPLIT_MODES[launch.split_mode] if launch.split_mode else None,
    }
    for name, value in knobs.items():
        if value is not None:
            command += [f"--{name}", str(value)]
    if launch.tensor_split:
        command += ["--tensor_split", *(f"{share:g}" for share in launch.tensor_split)]
    for name, text in launch.extra.items():
        command += [f"--{name}", text]
    if launch.rpc_servers:
        command += ["--rpc_servers", ",".join(launch.rpc_servers)]
    return command


def engine_env(launch: EngineLaunch, base: Mapping[str, str]) -> dict[str, str]:
    """The child's environment: ours, less anything the server would read as a setting, plus its key.

    >>> sorted(engine_env(EngineLaunch(Path("m"), 1, "k", 8), {"PORT": "80", "PATH": "/bin"}))
    ['API_KEY', 'PATH', 'PYTHONUNBUFFERED']
    """
    env = child_env({k: v for k, v in base.items() if k.lower() not in SERVER_SETTING_NAMES}, launch.env)
    env["API_KEY"] = launch.api_key
    env["PYTHONUNBUFFERED"] = "1"  # its log lines reach us as they happen
    return env
