"""Seed-OSS calls: Qwen3-Coder's ``<function=NAME>`` elements, each in its own ``<seed:tool_call>``.

As ByteDance Seed-OSS's template renders two calls::

    <seed:tool_call>
    <function=get_weather>
    <parameter=city>Paris</parameter>
    </function>
    </seed:tool_call>
    <seed:tool_call>
    <function=get_time>
    ...

The elements are Qwen3-Coder's, so :class:`~._tagged.TaggedCallParser` reads them (values typed
by the tool's schema), told the block's own closing tag. Its reasoning is ``<seed:think>``, known
to :mod:`._reasoning`.
"""

from __future__ import annotations

__all__ = ["SEED_CLOSE", "SEED_OPEN"]

SEED_OPEN = "<seed:tool_call>"
SEED_CLOSE = "</seed:tool_call>"
