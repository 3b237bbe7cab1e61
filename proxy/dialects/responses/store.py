"""Stored responses for ``previous_response_id``: bounded, in memory, one per toolpair process.

Each entry keeps the whole conversation of one response as Responses items (its input,
history included, then its output) plus the Response object itself. Items are shared
between entries, never copied or mutated, so a chain of continuations costs little more
than its new items; the byte count the caller gives is that new part. The oldest entries
go first once either limit is passed.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from proxy._types import Body, Messages
from proxy.errors import NotFoundError

__all__ = ["ResponseStore", "StoredResponse"]


@dataclass(frozen=True)
class StoredResponse:
    items: Messages  # input (history included) then output, as Responses items
    response: Body
    size: int


class ResponseStore:
    """A bounded map from response id to its conversation.

    Its methods are coroutines, as a shared store's (over the network) must be.

    >>> import asyncio
    >>> store = ResponseStore(max_entries=1, max_bytes=100)
    >>> asyncio.run(store.put("resp_a", [{"role": "user", "content": "hi"}], {"id": "resp_a"}, size=10))
    >>> asyncio.run(store.put("resp_b", [], {"id": "resp_b"}, size=10))
    >>> "resp_a" in store, asyncio.run(store.get("resp_b")).response["id"]
    (False, 'resp_b')
    """

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._bytes = 0

    def __contains__(self, response_id: object) -> bool:
        return response_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    async def put(self, response_id: str, items: Messages, response: Body, *, size: int) -> None:
        """Keep a response; an entry larger than the whole budget is not kept at all."""
        if self.max_entries < 1 or size > self.max_bytes:
            return
        self._drop(response_id)
        self._entries[response_id] = StoredResponse(items, response, size)
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self._bytes -= oldest.size

    async def get(self, response_id: str, *, previous: bool = False) -> StoredResponse:
        """The stored entry, or a 404 saying why it may be missing."""
        entry = self._entries.get(response_id)
        if entry is None:
            what = "Previous response" if previous else "Response"
            raise NotFoundError(
                f"{what} with id {response_id!r} not found. Responses are kept in this toolpair process's memory "
                "only when created with store=true, and the oldest are dropped past the store limits.",
                param="previous_response_id" if previous else None,
                code="previous_response_not_found" if previous else "response_not_found",
            )
        return entry

    async def delete(self, response_id: str) -> bool:
        return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True
