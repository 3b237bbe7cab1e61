"""API keys: who may use toolpair, checked before any handler runs.

Keys come from ``api_keys`` (YAML list, or ``TOOLPAIR_API_KEYS`` comma
separated) plus ``api_keys_file`` (one per line). A client presents one as
``Authorization: Bearer KEY`` or ``x-api-key: KEY``; the Anthropic SDK may send
either, so both are read on every route. A missing or wrong key is a 401 in
the error shape of the route family the path belongs to
(:func:`~proxy.errors.dialect_for_path`).

Only digests of the keys are held, and every presented value is compared with
every key by :func:`hmac.compare_digest` on equal-length SHA-256 digests, with
no early exit: the time taken says nothing about which key, or how much of it,
matched. Keys, and values that clients present, are never logged.

Probe paths stay open (:data:`~proxy.ops.paths.PROBE_PATHS`); so does ``/metrics``
unless ``metrics_require_key`` is set.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Iterable
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware
from multidict import MultiMapping

from proxy.config import ConfigError, Settings, listen_hosts
from proxy.errors import AuthenticationError
from proxy.ops.paths import METRICS_PATH, PROBE_PATHS, TOOLPAIR_METRICS_PATH

__all__ = [
    "KeyRing",
    "auth_middleware",
    "exposure_warning",
    "keys_required",
    "load_keys",
    "open_paths",
    "presented_keys",
    "upstream_key_problem",
]

log = logging.getLogger("toolpair.auth")


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


class KeyRing:
    """The keys toolpair accepts, held as SHA-256 digests only.

    >>> ring = KeyRing(["k1", "k2"])
    >>> ring.accepts(["k2"]), ring.accepts(["k3"]), ring.accepts([])
    (True, False, False)
    """

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(_digest(k) for k in keys)

    def __len__(self) -> int:
        return len(self._digests)

    def __repr__(self) -> str:
        return f"KeyRing({len(self._digests)} keys)"

    def accepts(self, presented: Iterable[str]) -> bool:
        """True when any presented value equals any key; always compares against all of them."""
        ok = False
        for value in presented:
            candidate = _digest(value)
            for key in self._digests:
                ok |= hmac.compare_digest(candidate, key)
        return ok


def _read_key_file(path: str) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read api_keys_file {path}: {exc.strerror}") from None
    keys = [line.strip() for line in text.splitlines()]
    keys = [k for k in keys if k and not k.startswith("#")]
    if not keys:
        # An empty file must not quietly turn authentication off.
        raise ConfigError(f"api_keys_file {path} holds no key")
    return keys


def keys_required(settings: Settings) -> bool:
    """Whether toolpair checks keys of its own (then client credentials never go upstream)."""
    return bool(settings.api_keys) or bool(settings.api_keys_file)


def upstream_key_problem(settings: Settings) -> str | None:
    """Why a sidecar must not start with these settings: an engine key of toolpair's own, but no keys to check.

    With ``upstream_api_key`` toolpair sends its own key to the engine in place of the client's, so
    the engine's key check no longer tells clients apart: without keys of toolpair's own, anyone
    who reaches toolpair would use a key-protected engine.

    >>> upstream_key_problem(Settings(upstream_api_key="k")) is not None
    True
    >>> upstream_key_problem(Settings(upstream_api_key="k", api_keys=["c"])) is None
    True
    """
    if settings.upstream_api_key is None or keys_required(settings):
        return None
    return (
        "upstream_api_key (TOOLPAIR_UPSTREAM_API_KEY) is set but toolpair checks no keys of its own: every "
        "client, with a wrong key or none, would reach the engine with yours. Either leave it unset (clients' own "
        "keys then reach the engine, which checks them), or also set api_keys (TOOLPAIR_API_KEYS) or api_keys_file."
    )


def load_keys(settings: Settings) -> KeyRing:
    """Every configured key; a key file that cannot be read or is empty is a ConfigError."""
    keys = [k.strip() for k in settings.api_keys]
    if any(not k for k in keys):
        raise ConfigError("api_keys: a key must not be empty")
    if settings.api_keys_file:
        keys += _read_key_file(settings.api_keys_file)
    return KeyRing(keys)


def presented_keys(headers: MultiMapping[str]) -> list[str]:
    """Values a client offers as its key: Bearer tokens and ``x-api-key`` headers.

    >>> from multidict import CIMultiDict
    >>> presented_keys(CIMultiDict({"Authorization": "bearer  abc ", "X-Api-Key": "def"}))
    ['abc', 'def']
    >>> presented_keys(CIMultiDict({"Authorization": "Basic dXNlcg=="}))
    []
    """
    found: list[str] = []
    for value in headers.getall("Authorization", []):
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            found.append(token.strip())
    found += [v.strip() for v in headers.getall("x-api-key", []) if v.strip()]
    return found


def open_paths(settings: Settings) -> frozenset[str]:
    """Paths served without a key."""
    return PROBE_PATHS if settings.metrics_require_key else PROBE_PATHS | {METRICS_PATH, TOOLPAIR_METRICS_PATH}


def auth_middleware(keys: KeyRing, unguarded: frozenset[str]) -> Middleware:
    """A middleware that refuses requests without one of ``keys``, except on ``unguarded`` paths."""

    @web.middleware
    async def check_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in unguarded:
            return await handler(request)
        presented = presented_keys(request.headers)
        if keys.accepts(presented):
            return await handler(request)
        message = (
            "invalid API key"
            if presented
            else "missing API key: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'"
        )
        raise AuthenticationError(message)  # answered by the error middleware, in the path's dialect

    return check_key


def _is_loopback(host: str) -> bool:
    if host.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def exposure_warning(host: str, has_keys: bool) -> str | None:
    """The start-up warning for a listener that others can reach and that asks for no key.

    >>> exposure_warning("127.0.0.1", False) is None, exposure_warning("0.0.0.0", True) is None
    (True, True)
    >>> exposure_warning("0.0.0.0", False)[:40]
    'toolpair listens on 0.0.0.0, beyond loop'
    >>> exposure_warning("127.0.0.1,::1", False) is None, exposure_warning("127.0.0.1,10.0.0.2", False) is None
    (True, False)
    """
    if has_keys or all(_is_loopback(address) for address in listen_hosts(host)):
        return None
    return (
        f"toolpair listens on {host}, beyond loopback, and asks for no API key: anyone who can reach "
        "this address can use the engine behind it. Set api_keys (TOOLPAIR_API_KEYS) or api_keys_file, "
        "or listen on 127.0.0.1."
    )
