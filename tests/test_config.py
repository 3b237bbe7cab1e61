"""Settings precedence, validation, and the documented defaults file."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from proxy.banner import proxy_banner
from proxy.cli import build_parser
from proxy.cli.proxy import load_proxy_settings
from proxy.config import ConfigError, Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent


def test_precedence_cli_then_env_then_file_then_defaults(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("port: 1000\nhost: 0.0.0.0\nupstream: http://file\nmax_body_bytes: 5\n")
    env = {"TOOLPAIR_PORT": "2000", "TOOLPAIR_UPSTREAM": "http://env"}
    settings = load_settings({"port": 3000, "host": None}, env, config)
    assert settings.port == 3000
    assert settings.upstream == "http://env"
    assert settings.host == "0.0.0.0"
    assert settings.max_body_bytes == 5
    assert settings.connect_timeout == Settings().connect_timeout


def test_config_file_from_environment(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("upstream_read_timeout: null\n")
    assert load_settings({}, {"TOOLPAIR_CONFIG": str(config)}).upstream_read_timeout is None


@pytest.mark.parametrize(
    ("text", "message"),
    [("nonsense: 1\n", "unknown setting 'nonsense'"), ("port: [1]\n", "port: expected a number"), ("- a\n", "mapping")],
)
def test_bad_config_files_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_settings({}, {}, config)


def test_bad_environment_value() -> None:
    with pytest.raises(ConfigError, match="TOOLPAIR_PORT"):
        load_settings({}, {"TOOLPAIR_PORT": "eighty"})


def test_default_yaml_documents_every_setting_with_its_default() -> None:
    documented = yaml.safe_load((ROOT / "config" / "default.yaml").read_text())
    defaults = {f.name: getattr(Settings(), f.name) for f in dataclasses.fields(Settings)}
    assert documented == defaults


def test_help_texts_are_real() -> None:
    top = subprocess.run([sys.executable, "-m", "proxy", "--help"], capture_output=True, text=True, check=True)
    assert "call order" in top.stdout and "proxy" in top.stdout
    sub = subprocess.run([sys.executable, "-m", "proxy", "proxy", "--help"], capture_output=True, text=True, check=True)
    assert "--upstream" in sub.stdout and "TOOLPAIR_" in sub.stdout


def test_proxy_without_upstream_is_a_clear_error() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "proxy"], capture_output=True, text=True, env={"PATH": "/usr/bin"}
    )
    assert run.returncode == 2 and "upstream is required" in run.stderr


@pytest.mark.parametrize("host", ["127.0.0.1,no-such-host.invalid", ","])
def test_an_address_the_proxy_cannot_listen_on_is_one_clear_line(host: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "proxy", "--upstream", "http://127.0.0.1:9", "--host", host, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2, run.stderr
    assert f"toolpair: cannot listen on {host}:0: " in run.stderr
    assert "Traceback" not in run.stderr


def test_engine_settings_from_every_source(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("engine_kind: llama-server\nreasoning: false\nvision: true\n")
    env = {"TOOLPAIR_TOOL_CALL_FORMAT": "mistral", "TOOLPAIR_THINK_IN_PROMPT": "yes"}
    settings = load_settings({"engine_kind": "llama-cpp-python"}, env, config)
    assert (settings.engine_kind, settings.tool_call_format) == ("llama-cpp-python", "mistral")
    assert (settings.reasoning, settings.think_in_prompt, settings.vision) == (False, True, True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--engine-kind", "vllm"], "invalid choice: 'vllm'"),
        (["--tool-call-format", "xml"], "invalid choice: 'xml'"),
    ],
)
def test_engine_options_are_checked_on_the_command_line(args: list[str], message: str) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "proxy", "--upstream", "http://127.0.0.1:9", *args],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and message in run.stderr


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("engine_kind: vllm\n", "expected one of llama-cpp-python, llama-server, generic, auto, got 'vllm'"),
        ("tool_call_format: xml\n", "unknown format 'xml'"),
        ("messages_mode: sometimes\n", "messages_mode: expected one of auto, native, translate, got 'sometimes'"),
    ],
)
def test_engine_settings_from_a_file_are_checked_at_startup(tmp_path: Path, text: str, message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(text)
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "proxy", "--upstream", "http://127.0.0.1:9", "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and message in run.stderr


def test_serve_engine_flags_use_llama_servers_names_and_beat_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from proxy.cli.serve import serve_settings

    monkeypatch.setenv("TOOLPAIR_ENGINE_THREADS", "3")
    monkeypatch.setenv("TOOLPAIR_ENGINE_TENSOR_SPLIT", "1,1")
    monkeypatch.setenv("TOOLPAIR_ENGINE_ARGS", "rope_freq_base=10000")
    config = tmp_path / "c.yaml"
    config.write_text("engine_ctx_size: 2048\nengine_cache_type_v: q4_0\nprompt_cache_size: 0\n")
    flags = "-c 16384 -t 4 -tb 8 -b 1024 -ub 256 -fa --cache-type-k q8_0 --mlock --no-mmap -ngl 12 --main-gpu 1"
    flags += " --split-mode row --tensor-split 3,1 --prompt-cache-size 2G --logprobs --engine-arg seed=7"
    flags += " --engine-arg numa=true --chat-template-file t.json"
    args = build_parser().parse_args(["serve", "--config", str(config), *flags.split()])
    settings = serve_settings(args)
    assert (settings.engine_ctx_size, settings.engine_threads, settings.engine_threads_batch) == (16384, 4, 8)
    assert (settings.engine_batch_size, settings.engine_ubatch_size, settings.engine_flash_attn) == (1024, 256, True)
    assert (settings.engine_cache_type_k, settings.engine_cache_type_v) == ("q8_0", "q4_0")
    assert (settings.engine_mlock, settings.engine_mmap, settings.engine_gpu_layers) == (True, False, 12)
    assert (settings.engine_main_gpu, settings.engine_split_mode, settings.engine_tensor_split) == (1, "row", [3, 1])
    assert (settings.prompt_cache_size, settings.engine_logprobs) == (2 << 30, True)
    assert settings.engine_args == ["seed=7", "numa=true"] and settings.chat_template == "t.json"
    plain = serve_settings(build_parser().parse_args(["serve", "--config", str(config), "-fa", "off"]))
    assert (plain.engine_ctx_size, plain.engine_threads, plain.engine_tensor_split) == (2048, 3, [1.0, 1.0])
    assert (plain.engine_args, plain.prompt_cache_size, plain.engine_flash_attn) == (["rope_freq_base=10000"], 0, False)
    assert (plain.engine_logprobs, plain.engine_mmap, plain.engine_mlock) == (None, True, False)


def test_a_renamed_setting_is_an_error_not_silently_ignored(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TOOLPAIR_ENGINE_MAX_CTX is gone: use TOOLPAIR_ENGINE_CTX_SIZE"):
        load_settings(env={"TOOLPAIR_ENGINE_MAX_CTX": "8192"})
    file = tmp_path / "old.yaml"
    file.write_text("engine_max_ctx: 8192\n")
    with pytest.raises(ConfigError, match=r"'engine_max_ctx' in .* is gone: use 'engine_ctx_size'"):
        load_settings(env={}, config_file=file)


def test_the_model_map_from_the_command_line_the_environment_and_a_file(tmp_path: Path) -> None:
    parser = build_parser()
    flags = ["proxy", "--upstream", "http://127.0.0.1:9", "--model-map", "claude-*haiku*=small"]
    args = parser.parse_args([*flags, "--model-map", "claude-*=big"])
    assert load_proxy_settings(args).model_map == ["claude-*haiku*=small", "claude-*=big"]  # in order
    config = tmp_path / "c.yaml"
    config.write_text('model_map: ["gpt-*=big", "local-model=small"]\n')
    assert load_settings({}, {}, config).model_map == ["gpt-*=big", "local-model=small"]
    assert load_settings({}, {"TOOLPAIR_MODEL_MAP": "gpt-*=big, o?=small"}).model_map == ["gpt-*=big", "o?=small"]
    banner = proxy_banner(load_proxy_settings(args), None)
    assert "  model names:    claude-*haiku*=small, claude-*=big (first match;" in banner


def test_a_bad_model_map_entry_is_refused_before_anything_starts() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "proxy", "proxy", "--upstream", "http://127.0.0.1:9", "--model-map", "claude-*"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "model_map: 'claude-*' is not PATTERN=MODEL" in run.stderr
