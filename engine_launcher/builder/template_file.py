"""A chat template file as Hugging Face saves it (``tokenizer_config.json``): its template and special tokens.

Stdlib only: ``models.py`` checks a file with it before serve starts the engine, in the Docker
image's engine layer too (see the Dockerfile), and the engine process reads the file with it.
"""

from __future__ import annotations

__all__ = ["TemplateFileError", "template_file_parts"]


class TemplateFileError(ValueError):
    """A template file that is not a tokenizer_config-style object with a chat template."""


def template_file_parts(config: object) -> tuple[str, str, str]:
    """The chat template, BOS and EOS token of a Hugging Face ``tokenizer_config.json``-style object.

    Of a list of named templates, the ``tool_use`` one, else ``default``. Tokens may be strings or
    transformers' saved ``AddedToken`` objects (``{"content": "<s>", ...}``), and may be missing (a
    template that does not print them needs none).

    >>> template_file_parts({"chat_template": "{{ bos_token }}", "bos_token": {"content": "<s>"}})
    ('{{ bos_token }}', '<s>', '')
    """
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("tool_use") or named.get("default")
    if not isinstance(config, dict) or not isinstance(template, str) or not template.strip():
        raise TemplateFileError("it has no string chat_template (a tokenizer_config.json-style object)")
    tokens = []
    for name in ("bos_token", "eos_token"):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if value is not None and not isinstance(value, str):
            raise TemplateFileError(f"its {name} is neither a string nor an object with a string content")
        tokens.append(value or "")
    return template, tokens[0], tokens[1]
