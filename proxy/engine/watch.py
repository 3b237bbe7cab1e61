"""What engine the sidecar sits in front of: found in the background, and found again whenever it comes back.

``toolpair proxy`` listens at once, whether or not anything answers at its upstream
(an orchestrator probing ``/health`` should not get connection refused while the
engine loads), so the engine's kind cannot be a start-up fact. :class:`EngineWatch`
is the one owner of what is known about it: the :class:`EngineFound` of the last
detection (kind, :class:`~proxy.engine.plan.EngineSetup`, API modes, when), and
whether the engine answers now. A background task asks the upstream what it is
until it answers, then checks its ``/health`` now and then; an engine that stopped
answering is detected afresh when it answers again (a restarted llama-server may be
another build, or another engine on the same port).

A kind named in the settings (``--engine-kind``, and ``toolpair serve``, which names
its own) is known from the start: nothing is asked and nothing is gated. So is an
``auto`` kind when nobody asked for it to be found (``find`` false: an app built
in-process, whose ``auto`` has always meant ``generic``).

The engine's ``/v1/models`` is read with each detection: what it lists decides model names with
the settings' ``model_map`` (:mod:`proxy.engine.model_names`; :attr:`EngineWatch.model_names`).

The decision is :func:`proxy.engine.detect.detect_engine`'s (pure); this module is the I/O
around it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import orjson

from proxy.config import ApiMode, EngineKind, Settings
from proxy.engine.detect import PROBE_PATHS, Detection, ProbeAnswer, api_modes, detect_engine, engine_lines
from proxy.engine.model_names import (
    MODELS_PATH,
    NO_MODELS,
    EngineModels,
    ModelNames,
    listed_models,
    model_line,
    parse_model_map,
)
from proxy.engine.plan import EngineSetup, engine_setup, settings_for_engine
from proxy.engine.upstream import Upstream
from proxy.errors import EngineUnavailableError, UpstreamError

__all__ = ["EngineFound", "EngineWatch"]

log = logging.getLogger("toolpair")

_PROBE_TIMEOUT = 5.0
_BODY_LIMIT = 1 << 20


@dataclass(frozen=True)
class EngineFound:
    """One detection: what the engine is, what toolpair does in front of it, and when that was found."""

    detection: Detection
    settings: Settings
    """The settings with ``engine_kind`` resolved to what was found."""
    setup: EngineSetup
    modes: Mapping[str, ApiMode]
    at: float
    """Wall-clock time of the detection (``time.time()``)."""
    models: EngineModels = NO_MODELS
    """What the engine listed at ``/v1/models`` when it was found (nothing, for a kind named in the settings)."""


def _found(
    settings: Settings, detection: Detection, template: str | None, models: EngineModels = NO_MODELS
) -> EngineFound:
    resolved = settings_for_engine(dataclasses.replace(settings, engine_kind=detection.kind), template)
    return EngineFound(detection, resolved, engine_setup(resolved), api_modes(resolved), time.time(), models)


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


class EngineWatch:
    """The engine as toolpair knows it now; :meth:`run` keeps that true while the app runs.

    ``retry`` is how often an engine that does not answer is asked again; ``recheck`` how often
    one that answers has its ``/health`` read (a restart between two checks shows as another
    ``Server`` header, or as a failed check).
    """

    def __init__(
        self,
        settings: Settings,
        *,
        find: bool = True,
        retry: float = 1.0,
        recheck: float = 5.0,
        chat_template: str | None = None,
    ) -> None:
        self._settings = settings
        self._template = chat_template
        """The model's chat template (``--chat-template-file``): followed for an engine found to need it."""
        self.retry = retry
        self.recheck = recheck
        self.named = settings.engine_kind is not EngineKind.AUTO or not find
        kind = settings.engine_kind if settings.engine_kind is not EngineKind.AUTO else EngineKind.GENERIC
        how = "named in the settings (engine_kind)" if kind is settings.engine_kind else "not detected: generic"
        named = Detection(kind, how, False)
        self._found: EngineFound | None = _found(settings, named, chat_template) if self.named else None
        self._unanswered: str | None = None if self.named else "not asked yet"
        """Why the engine does not answer now; None while it does."""
        self._fallback = engine_setup(settings)  # before anything is found: the generic kind
        self._detecting = asyncio.Lock()
        self._asked = 0
        """How many detections were made: callers that waited for one in progress take its answer."""
        self._changed = asyncio.Event()
        self._model_map = parse_model_map(settings.model_map)
        self._names = ModelNames(self._model_map)

    # --- what handlers read (no I/O) ---

    @property
    def found(self) -> EngineFound | None:
        return self._found

    @property
    def answering(self) -> bool:
        return self._unanswered is None

    @property
    def unanswered(self) -> str | None:
        """Why the engine does not answer now, or None."""
        return self._unanswered

    @property
    def setup(self) -> EngineSetup:
        return self._found.setup if self._found is not None else self._fallback

    @property
    def model_names(self) -> ModelNames:
        """What decides each request's model name now: the settings' map and the engine's list."""
        return self._names

    def mode(self, api_path: str) -> ApiMode:
        """``native`` or ``translate`` for ``/v1/messages`` or ``/v1/responses`` with the engine found now."""
        if self._found is not None:
            return self._found.modes[api_path]
        return api_modes(self._settings)[api_path]

    def describe(self) -> dict[str, object]:
        """For ``/ready``: what was found and when, and whether it answers."""
        found = self._found
        engine: dict[str, object] = {"kind": found.detection.kind.value if found else None}
        if found is not None and found.detection.detected:
            engine["found_at"] = _utc(found.at)
            engine["how"] = found.detection.how
        if self._unanswered is not None:
            engine["error"] = self._unanswered
        return engine

    # --- the gate ---

    def ready_now(self) -> bool:
        """Whether :meth:`known` answers at once: the engine found and answering (or named: never waited for)."""
        return self._found is not None and (self.named or self._unanswered is None)

    async def known(self, upstream: Upstream) -> EngineFound:
        """The engine found, asking it now when it did not answer last time; refuses while it does not answer.

        Raises :class:`~proxy.errors.EngineUnavailableError` (503, in the caller's API shape) saying the
        engine is not reachable yet. A named kind never waits: its requests go and fail as they fail.
        """
        if self._found is not None and self.ready_now():
            return self._found
        await self.detect(upstream)
        if self._found is None or self._unanswered is not None:
            raise EngineUnavailableError(
                f"the engine at {upstream.base_url} is not reachable yet ({self._unanswered}); toolpair asks "
                f"again every {self.retry:g}s and serves this request once it answers",
                retry_after=max(1, round(self.retry)),
            )
        return self._found

    def lost(self, reason: str) -> None:
        """The engine stopped answering (a failed check): the next answer is detected afresh."""
        if self.named or self._unanswered is not None:
            return
        self._unanswered = reason
        log.warning(
            "the engine stopped answering at %s (%s); API requests get 503 until it answers again",
            _utc(time.time()),
            reason,
        )
        self._changed.set()

    # --- the I/O ---

    async def detect(self, upstream: Upstream) -> None:
        """Ask the upstream what it is (once at a time: callers arriving meanwhile share the answer)."""
        if self.named:
            return
        asked = self._asked
        async with self._detecting:
            if self._asked != asked:
                return  # another caller asked while this one waited: its answer stands for both
            self._asked += 1
            answers = [await _probe(upstream, PROBE_PATHS[0])]
            if answers[0].status is not None:
                answers += [await _probe(upstream, path) for path in PROBE_PATHS[1:]]
                models = listed_models((await _probe(upstream, MODELS_PATH)).body)
            else:
                errors = f"{answers[0].path}: {answers[0].error}"
                if self._unanswered in (None, "not asked yet"):
                    log.info(
                        "the engine at %s does not answer yet (%s); toolpair listens and asks again every %gs",
                        upstream.base_url,
                        errors,
                        self.retry,
                    )
                self._unanswered = errors
                return
            self._take(detect_engine(answers), models)

    def _take(self, detection: Detection, models: EngineModels) -> None:
        before = self._found
        self._found = _found(self._settings, detection, self._template, models)
        self._names = ModelNames(self._model_map, models)
        self._unanswered = None
        again = "again " if before is not None else ""
        log.info("engine found %sat %s:", again, _utc(self._found.at))
        for line in (*engine_lines(self._found.settings, detection), model_line(self._model_map, models)):
            log.info("%s", line)

    async def run(self, upstream: Upstream) -> None:
        """The background task: detect until the engine answers, then check it now and then."""
        if self.named:
            return
        while True:
            if self._unanswered is not None:
                await self.detect(upstream)
            else:
                await self._check(upstream)
            wait = self.retry if self._unanswered is not None else self.recheck
            self._changed.clear()
            try:
                async with asyncio.timeout(wait):
                    await self._changed.wait()
            except TimeoutError:
                pass

    async def _check(self, upstream: Upstream) -> None:
        health = await _probe(upstream, PROBE_PATHS[0])
        if health.status is None:
            self.lost(f"{health.path}: {health.error}")
            return
        seen = detect_engine([health]).kind
        if self._found is not None and seen is not self._found.detection.kind:
            log.info("the engine's /health now says %s: detecting it again", seen.value)
            await self._redetect(upstream)

    async def _redetect(self, upstream: Upstream) -> None:
        self._unanswered = "being detected again"
        await self.detect(upstream)


async def _probe(upstream: Upstream, path: str) -> ProbeAnswer:
    try:
        async with (
            asyncio.timeout(_PROBE_TIMEOUT),
            upstream.open("GET", path, {"Accept": "application/json"}, None) as response,
        ):
            status = response.status
            headers = {k.lower(): v for k, v in response.headers.items()}
            raw = await response.content.read(_BODY_LIMIT)
    except UpstreamError as exc:
        return ProbeAnswer(path, error=exc.message)
    except TimeoutError:
        return ProbeAnswer(path, error=f"no answer within {_PROBE_TIMEOUT:g}s")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    return ProbeAnswer(path, status, headers, body)
