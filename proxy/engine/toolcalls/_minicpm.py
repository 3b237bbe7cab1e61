"""MiniCPM 5 calls: ``<function name="NAME">`` elements of ``<param name="K">V</param>``, with no block around them.

As openbmb's MiniCPM5-1B template renders two calls::

    <function name="get_weather"><param name="city">Paris</param></function>
    <function name="get_time"><param name="city">Tokyo</param><param name="utc_offset">9</param></function>

:mod:`._invoke`'s grammar under other element names: each element is a call of its own, so its
opening is the start marker. The template writes a string holding ``<``, ``&`` or a newline in
``<![CDATA[...]]>``, which is unwrapped; other values are text (a list as Python writes it), typed
by the tool's schema (:mod:`._typed`).
"""

from __future__ import annotations

from proxy.engine.toolcalls._invoke import InvokeGrammar

__all__ = ["MINICPM5", "MINICPM5_OPEN"]

MINICPM5 = InvokeGrammar("", (), invoke="function", parameter="param", cdata=True)
MINICPM5_OPEN = MINICPM5.opener
