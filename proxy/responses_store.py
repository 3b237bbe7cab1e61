"""Stored responses for ``previous_response_id``: bounded, in this process's memory or in Redis.

Each stored response stands for its whole conversation as Responses items (its input,
history included, then its output) plus the Response object itself. Both stores keep a
chain of continuations cheap: the memory store shares item objects between entries, the
Redis store keeps each response's new items with a link to its parent. Both drop the
oldest entries once ``max_entries`` or ``max_bytes`` is passed (the byte count the caller
gives: the new part of each response) and forget an entry ``ttl`` seconds after it was
stored. A conversation a response continues stays readable as long as that response is
kept, even once its ancestors are dropped.

The memory store is the default and belongs to one toolpair process. The Redis store
(``responses_store: redis://HOST:PORT/DB``) is shared by every replica that names the same
database and outlives restarts; when Redis cannot be reached, its calls raise
:class:`~proxy.errors.StoreUnavailableError` (503).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from proxy._types import Body, Messages
from proxy.config import ConfigError, Settings
from proxy.errors import NotFoundError, StoreUnavailableError
from proxy.status import public_url

if TYPE_CHECKING:
    import redis.asyncio

__all__ = [
    "RedisResponseStore",
    "ResponseStore",
    "StoredResponse",
    "StoredResponses",
    "create_response_store",
]

log = logging.getLogger("toolpair")


@dataclass(frozen=True)
class StoredResponse:
    items: Messages  # input (history included) then output, as Responses items
    response: Body
    size: int
    stored_at: float = 0.0  # time.monotonic() when stored (memory store)


class StoredResponses(Protocol):
    """What the Responses handlers need from a store; every call may wait on I/O."""

    async def start(self) -> None:
        """Called once when the app starts."""

    async def close(self) -> None:
        """Called once when the app stops."""

    async def ready(self) -> None:
        """Raise StoreUnavailableError now if a write would fail, before an engine is asked."""

    async def get(self, response_id: str, *, previous: bool = False) -> StoredResponse:
        """The stored entry, or NotFoundError (404) saying why it may be missing."""

    async def put(
        self, response_id: str, items: Messages, response: Body, *, size: int, previous: StoredResponse | None = None
    ) -> None:
        """Keep a response; ``previous`` is the entry it continues, whose items ``items`` starts with."""

    async def delete(self, response_id: str) -> bool:
        """Forget a response; False when it was not stored."""


def _not_found(response_id: str, previous: bool, where: str) -> NotFoundError:
    what = "Previous response" if previous else "Response"
    return NotFoundError(
        f"{what} with id {response_id!r} not found. Responses are kept in {where} only when created with "
        "store=true, for responses_store_ttl seconds, and the oldest are dropped past the store limits.",
        param="previous_response_id" if previous else None,
        code="previous_response_not_found" if previous else "response_not_found",
    )


class ResponseStore:
    """A bounded map from response id to its conversation, in this process's memory.

    >>> import asyncio
    >>> store = ResponseStore(max_entries=1, max_bytes=100)
    >>> asyncio.run(store.put("resp_a", [{"role": "user", "content": "hi"}], {"id": "resp_a"}, size=10))
    >>> asyncio.run(store.put("resp_b", [], {"id": "resp_b"}, size=10))
    >>> "resp_a" in store, asyncio.run(store.get("resp_b")).response["id"]
    (False, 'resp_b')
    """

    def __init__(self, max_entries: int, max_bytes: int, ttl: float | None = None) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def ready(self) -> None:
        return None

    async def put(
        self, response_id: str, items: Messages, response: Body, *, size: int, previous: StoredResponse | None = None
    ) -> None:
        """Keep a response; an entry larger than the whole budget is not kept at all.

        ``items`` shares its objects with ``previous``'s, so nothing needs ``previous`` here.
        """
        if self.max_entries < 1 or size > self.max_bytes:
            return
        self._drop(response_id)
        now = time.monotonic()
        self._entries[response_id] = StoredResponse(items, response, size, now)
        self._bytes += size
        self._expire(now)
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._bytes -= oldest.size

    async def get(self, response_id: str, *, previous: bool = False) -> StoredResponse:
        """The stored entry, or a 404 saying why it may be missing."""
        self._expire(time.monotonic())
        entry = self._entries.get(response_id)
        if entry is None:
            raise _not_found(response_id, previous, "this toolpair process's memory")
        return entry

    async def delete(self, response_id: str) -> bool:
        return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True

    def _expire(self, now: float) -> None:
        """Entries are in the order they were stored: drop from the oldest end while too old."""
        if self.ttl is None:
            return
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if now - oldest.stored_at <= self.ttl:
                return
            self._entries.popitem(last=False)
            self._bytes -= oldest.size


# --- Redis ----------------------------------------------------------------------------------------
#
# One hash per response, PREFIX "e:" ID, with the fields
#   r  the Response object (JSON)       present while the response itself is kept
#   s  its size for the byte budget     present while the response itself is kept
#   i  its new items (JSON list)        what it adds to its parent's conversation
#   p  the parent's id, or ""           the response it continues ("" = items hold the whole conversation)
#   d  links from here to a root
#   n  references: 1 while the response is kept, plus one per child hash whose p names it
#   t  when it was stored, in milliseconds of the Redis server's clock (one clock for all replicas)
# plus PREFIX "order" (a sorted set of kept ids, scored by PREFIX "seq", a counter, so the
# oldest is first), and PREFIX "bytes" (the sum of s over kept responses). Dropping a response
# (eviction, TTL, DELETE) removes r and s and releases one reference; a hash whose count falls
# to 0 is deleted and releases its parent in turn, so a chain's items live exactly as long as
# some response that needs them. Scripts run atomically, so replicas never see half a change.

_LUA_COMMON = """
local prefix = ARGV[1]
local order = prefix .. 'order'
local bytes = prefix .. 'bytes'
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

local function release(key)
  while key do
    if redis.call('HINCRBY', key, 'n', -1) > 0 then return end
    local parent = redis.call('HGET', key, 'p')
    redis.call('DEL', key)
    if parent and parent ~= '' then key = prefix .. 'e:' .. parent else key = nil end
  end
end

local function drop(id)
  if redis.call('ZREM', order, id) == 0 then return 0 end
  local key = prefix .. 'e:' .. id
  local size = redis.call('HGET', key, 's')
  if size then redis.call('DECRBY', bytes, size) end
  redis.call('HDEL', key, 'r', 's')
  release(key)
  return 1
end

local function oldest()
  return redis.call('ZRANGE', order, 0, 0)[1]
end

local function expire(ttl)
  if ttl <= 0 then return end
  while true do
    local id = oldest()
    if not id then return end
    local stored = tonumber(redis.call('HGET', prefix .. 'e:' .. id, 't') or '0')
    if stored >= now - ttl then return end
    drop(id)
  end
end
"""

# ARGV: prefix, id, response, items, parent, size, max_entries, max_bytes, ttl_ms, max_depth
_LUA_PUT = (
    _LUA_COMMON
    + """
local id, parent = ARGV[2], ARGV[5]
local size, max_entries, max_bytes = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
expire(tonumber(ARGV[9]))
local key = prefix .. 'e:' .. id
drop(id)
if redis.call('EXISTS', key) == 1 then return 'taken' end
local depth = 0
local parent_key
if parent ~= '' then
  parent_key = prefix .. 'e:' .. parent
  local parent_depth = redis.call('HGET', parent_key, 'd')
  if not parent_depth then return 'orphan' end
  depth = tonumber(parent_depth) + 1
  if depth > tonumber(ARGV[10]) then return 'rebase' end
  redis.call('HINCRBY', parent_key, 'n', 1)
end
redis.call('HSET', key, 'r', ARGV[3], 's', size, 'i', ARGV[4], 'p', parent, 'd', depth, 'n', 1, 't', now)
redis.call('ZADD', order, redis.call('INCR', prefix .. 'seq'), id)
redis.call('INCRBY', bytes, size)
while redis.call('ZCARD', order) > max_entries or tonumber(redis.call('GET', bytes) or '0') > max_bytes do
  local victim = oldest()
  if not victim then redis.call('SET', bytes, 0) break end
  drop(victim)
end
return 'ok'
"""
)

# ARGV: prefix, id, ttl_ms, max_depth. Returns {response, size, own items, parent's items, ...}.
_LUA_GET = (
    _LUA_COMMON
    + """
expire(tonumber(ARGV[3]))
local key = prefix .. 'e:' .. ARGV[2]
local head = redis.call('HMGET', key, 'r', 's')
if not head[1] then return {} end
local out = {head[1], head[2]}
local limit = tonumber(ARGV[4]) + 1
while key do
  local link = redis.call('HMGET', key, 'i', 'p')
  if not link[1] or #out > limit + 2 then return {'broken'} end
  table.insert(out, link[1])
  if link[2] and link[2] ~= '' then key = prefix .. 'e:' .. link[2] else key = nil end
end
return out
"""
)

# ARGV: prefix, id, ttl_ms
_LUA_DELETE = (
    _LUA_COMMON
    + """
expire(tonumber(ARGV[3]))
return drop(ARGV[2])
"""
)

_MAX_DEPTH = 64
"""Links walked to read a conversation: past this a response is stored whole, as a new root."""
_TIMEOUT = 5.0
"""Seconds a Redis call may take before the request that needs it gets a 503."""
_LOG_EVERY = 10.0


def _continued(items: Messages, previous: StoredResponse | None) -> tuple[str, Sequence[Any]]:
    """(parent id, new items) when ``items`` continues ``previous`` unchanged, else ("", items).

    >>> first = StoredResponse([{"a": 1}], {"id": "resp_1"}, 1)
    >>> _continued([{"a": 1}, {"b": 2}], first), _continued([{"a": 9}, {"b": 2}], first)
    (('resp_1', [{'b': 2}]), ('', [{'a': 9}, {'b': 2}]))
    """
    if previous is None:
        return "", items
    known = previous.items
    if len(items) < len(known) or any(a is not b and a != b for a, b in zip(known, items, strict=False)):
        return "", items
    return str(previous.response["id"]), items[len(known) :]


class RedisResponseStore:
    """The Responses store shared by replicas, in one Redis database (standalone Redis, not Cluster)."""

    def __init__(
        self, url: str, max_entries: int, max_bytes: int, ttl: float | None = None, prefix: str = "toolpair:responses:"
    ) -> None:
        import redis.asyncio
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = url
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.ttl = ttl
        self.prefix = prefix
        self._logged_at = -_LOG_EVERY
        # One retry: a pooled connection that broke while Redis restarted is replaced at once.
        self._redis: redis.asyncio.Redis = redis.asyncio.Redis.from_url(
            url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT, retry=Retry(NoBackoff(), 1)
        )
        self._put = self._redis.register_script(_LUA_PUT)
        self._get = self._redis.register_script(_LUA_GET)
        self._delete = self._redis.register_script(_LUA_DELETE)

    @property
    def _ttl_ms(self) -> int:
        return 0 if self.ttl is None else max(1, int(self.ttl * 1000))

    @contextmanager
    def _mapped(self) -> Iterator[None]:
        """Redis's failures, as the one error the handlers know.

        The client learns only that the store is unavailable; the address and Redis's own
        words go to the log, at most once per ``_LOG_EVERY`` seconds while the outage lasts.
        """
        from redis.exceptions import RedisError

        try:
            yield
        except (RedisError, OSError) as exc:
            now = time.monotonic()
            if now - self._logged_at >= _LOG_EVERY:
                self._logged_at = now
                log.warning("responses: Redis at %s: %s: %s", public_url(self.url), type(exc).__name__, exc)
            raise StoreUnavailableError("the shared store of Responses is unavailable; retry shortly") from None

    async def ready(self) -> None:
        with self._mapped():
            await self._redis.ping()

    async def put(
        self, response_id: str, items: Messages, response: Body, *, size: int, previous: StoredResponse | None = None
    ) -> None:
        if self.max_entries < 1 or size > self.max_bytes:
            return
        parent, fresh = _continued(items, previous)
        encoded = orjson.dumps(response)
        with self._mapped():
            status = await self._put_once(response_id, encoded, fresh, parent, size)
            if status in (b"orphan", b"rebase"):  # the parent's items are gone, or the chain is long
                status = await self._put_once(response_id, encoded, items, "", size)
        if status != b"ok":
            log.warning("responses: %s was not stored (%s)", response_id, status.decode(errors="replace"))

    async def _put_once(self, response_id: str, encoded: bytes, items: Sequence[Any], parent: str, size: int) -> bytes:
        args: list[str | bytes | int] = [self.prefix, response_id, encoded, orjson.dumps(items), parent, size]
        args += [self.max_entries, self.max_bytes, self._ttl_ms, _MAX_DEPTH]
        result = await self._put(args=args)
        return bytes(result)

    async def get(self, response_id: str, *, previous: bool = False) -> StoredResponse:
        with self._mapped():
            found = await self._get(args=[self.prefix, response_id, self._ttl_ms, _MAX_DEPTH])
        if not found or found == [b"broken"]:
            raise _not_found(response_id, previous, "the shared Redis store")
        response, size, *links = found
        items: Messages = []
        for link in reversed(links):
            items.extend(orjson.loads(link))
        return StoredResponse(items, orjson.loads(response), int(size))

    async def delete(self, response_id: str) -> bool:
        with self._mapped():
            return bool(await self._delete(args=[self.prefix, response_id, self._ttl_ms]))

    async def start(self) -> None:
        """Say at start-up whether Redis answers; start-up does not wait for it.

        Until it answers, only the requests that need the store fail (503).
        """
        try:
            await self.ready()
            log.info("responses: stored in Redis at %s", public_url(self.url))
        except StoreUnavailableError:
            log.warning("responses: requests that need the store get 503 until Redis answers")

    async def close(self) -> None:
        await self._redis.aclose()


def create_response_store(settings: Settings) -> StoredResponses:
    """The store ``settings.responses_store`` names; nothing is connected until it is used."""
    where = settings.responses_store
    limits = (settings.responses_store_max_entries, settings.responses_store_max_bytes, settings.responses_store_ttl)
    if where == "memory":
        return ResponseStore(*limits)
    if not where.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(f"responses_store: expected memory or a redis:// URL, got {public_url(where)!r}")
    try:
        import redis.asyncio  # noqa: F401 - only to say what is missing
    except ImportError:
        raise ConfigError(
            "responses_store: a Redis store needs the redis package: pip install 'toolpair[redis]'"
        ) from None
    return RedisResponseStore(where, *limits)
