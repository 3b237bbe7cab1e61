"""Settings precedence, validation, and the documented defaults file."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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
        ("engine_kind: vllm\n", "engine_kind: expected one of llama-cpp-python, llama-server, generic, got 'vllm'"),
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
