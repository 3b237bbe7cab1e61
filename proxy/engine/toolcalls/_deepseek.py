# ruff: noqa: RUF001, RUF002  # the fullwidth bar is how DeepSeek's tokenizer spells its tokens
"""DeepSeek calls: V3.1's ``NAME<｜tool▁sep｜>{…}`` and R1's (and V3's) fenced ``function<｜tool▁sep｜>NAME``.

As DeepSeek-V3.1's template renders two calls::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Tokyo"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(on one line), and as the R1 distills' template renders one::

    <｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>

Both share the tokens, so one description reads both: a head that is
``function<｜tool▁sep｜>NAME`` and a fence is R1's form, a head ``NAME<｜tool▁sep｜>``
V3.1's (a tool named ``function`` still reads right: its arguments follow the
separator at once). The tokens use the fullwidth bar ``｜`` and ``▁``, as the
tokenizer spells them.
"""

from __future__ import annotations

import re

from proxy.engine.toolcalls._sectioned import SectionFormat

__all__ = ["DEEPSEEK", "DEEPSEEK_CALLS"]

DEEPSEEK_CALLS = "<｜tool▁calls▁begin｜>"
_SEP = re.escape("<｜tool▁sep｜>")
_NAME = r"(?P<name>[\w.\-/]+)"

DEEPSEEK = SectionFormat(
    section=DEEPSEEK_CALLS,
    call="<｜tool▁call▁begin｜>",
    call_end="<｜tool▁call▁end｜>",
    section_end="<｜tool▁calls▁end｜>",
    heads=(
        re.compile(rf"\s*function{_SEP}\s*{_NAME}\s*```(?:json)?\s*"),
        re.compile(rf"\s*{_NAME}\s*{_SEP}\s*"),
    ),
    tail=("```",),
)
