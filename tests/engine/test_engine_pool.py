"""The engine pool behind ``toolpair serve --parallel N``: which engine a request gets, and who waits.

First the pure :class:`~proxy.engine.queueing.Schedule` (no event loop at all), then the
asyncio :class:`~proxy.engine.queueing.EnginePool` around it, in process: no sockets, no
sleeps. The real engines are in tests/test_parallel_serve.py.
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from aiohttp import web

from proxy.engine.queueing import EnginePool, PoolEngine, Schedule, Ticket, conversation_key
from proxy.engine.upstream import EngineTarget
from proxy.errors import EngineUnavailableError, QueueFullError

NO_REQUEST = cast(web.Request, None)


def given(assignments: list[tuple[Ticket, str]]) -> list[str]:
    return [name for _, name in assignments]


# --- conversation_key ----------------------------------------------------------------------

SYSTEM = {"role": "system", "content": "You are a coding agent."}
FIRST = {"role": "user", "content": "Fix the failing test."}


def test_a_conversation_keeps_its_key_as_it_grows() -> None:
    turn1 = [SYSTEM, FIRST]
    turn2 = [*turn1, {"role": "assistant", "content": "Looking."}, {"role": "user", "content": "Go on."}]
    turn3 = [*turn2, {"role": "assistant", "tool_calls": []}, {"role": "tool", "tool_call_id": "a", "content": "x"}]
    assert conversation_key(turn1) == conversation_key(turn2) == conversation_key(turn3) is not None


def test_per_turn_markup_on_content_parts_does_not_change_the_key() -> None:
    plain = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Fix the failing test."}]}]
    marked = [
        SYSTEM,
        {"role": "user", "content": [{"type": "text", "text": "Fix the failing test.", "cache_control": {"t": 1}}]},
    ]
    assert conversation_key(plain) == conversation_key(marked)


def test_other_system_prompts_or_first_messages_are_other_conversations() -> None:
    main = conversation_key([SYSTEM, FIRST])
    subagent = conversation_key([{"role": "system", "content": "You are a search subagent."}, FIRST])
    other_task = conversation_key([SYSTEM, {"role": "user", "content": "Write the docs."}])
    developer = conversation_key([{"role": "developer", "content": "You are a coding agent."}, FIRST])
    assert len({main, subagent, other_task, developer}) == 4


def test_nothing_to_name_a_conversation_by_gives_none() -> None:
    assert conversation_key([]) is None
    assert conversation_key(None) is None
    assert conversation_key("not a list") is None
    assert conversation_key([{"role": "assistant", "content": "hi"}]) is None
    assert conversation_key([SYSTEM]) is not None  # a system prompt alone still names it


# --- the pure schedule --------------------------------------------------------------------


def test_requests_go_to_free_engines_least_recently_used_first() -> None:
    schedule = Schedule(["e0", "e1"])
    a, b, c = Ticket("A"), Ticket("B"), Ticket("C")
    assert given(schedule.arrive(a)) == ["e0"]
    assert given(schedule.arrive(b)) == ["e1"]  # e0 is busy
    assert schedule.arrive(c) == [] and schedule.waiting == 1
    assert schedule.release("e1") == [(c, "e1")]  # the first in line gets the freed engine
    schedule.release("e0")
    schedule.release("e1")
    # Both free; no affinity for D: e0 was used longest ago, so its cached conversation is the one to lose.
    assert given(schedule.arrive(Ticket("D"))) == ["e0"]


def test_a_conversation_goes_back_to_the_engine_that_served_it() -> None:
    schedule = Schedule(["e0", "e1"])
    assert given(schedule.arrive(Ticket("A"))) == ["e0"]
    assert given(schedule.arrive(Ticket("B"))) == ["e1"]
    schedule.release("e0")
    schedule.release("e1")
    # e0 is the least recently used, but B's state is on e1.
    assert given(schedule.arrive(Ticket("B"))) == ["e1"]
    assert given(schedule.arrive(Ticket("A"))) == ["e0"]
    assert schedule.engine_of("A") == "e0" and schedule.engine_of("B") == "e1"


def test_a_busy_own_engine_does_not_hold_a_request_back_from_a_free_one() -> None:
    schedule = Schedule(["e0", "e1"])
    schedule.arrive(Ticket("A"))  # A is on e0 and still running
    assert given(schedule.arrive(Ticket("A"))) == ["e1"]  # a second request of A: e1 is free, take it
    assert schedule.engine_of("A") == "e1"  # its latest turn is on e1 now


def test_the_line_is_first_come_first_served_even_against_affinity() -> None:
    schedule = Schedule(["e0", "e1"])
    schedule.arrive(Ticket("A"))  # e0
    schedule.arrive(Ticket("B"))  # e1
    wants_e0, wants_e1 = Ticket("A"), Ticket("B")
    schedule.arrive(wants_e0)
    schedule.arrive(wants_e1)
    # e1 frees first: the head of the line (A, whose engine is e0) gets it rather than wait.
    assert schedule.release("e1") == [(wants_e0, "e1")]
    assert schedule.release("e0") == [(wants_e1, "e0")]
    assert schedule.waiting == 0 and schedule.active == 2


def test_a_request_that_leaves_the_line_is_skipped() -> None:
    schedule = Schedule(["e0"])
    schedule.arrive(Ticket())
    leaver, next_one = Ticket(), Ticket()
    schedule.arrive(leaver)
    schedule.arrive(next_one)
    assert schedule.leave(leaver) is True
    assert schedule.leave(leaver) is False  # gone already
    assert schedule.release("e0") == [(next_one, "e0")]


def test_an_engine_that_is_down_gets_nothing_until_it_is_up() -> None:
    schedule = Schedule(["e0", "e1"])
    schedule.arrive(Ticket("A"))  # e0
    schedule.release("e0")
    schedule.set_up("e0", False)  # e0 crashed and restarts
    assert given(schedule.arrive(Ticket("A"))) == ["e1"]  # A's engine is down: the other serves
    waiter = Ticket("C")
    assert schedule.arrive(waiter) == []
    assert schedule.set_up("e0", True) == [(waiter, "e0")]  # back up: the line moves at once


def test_when_every_engine_is_gone_the_line_can_be_refused() -> None:
    schedule = Schedule(["e0", "e1"])
    schedule.set_up("e0", False, alive=False)
    schedule.set_up("e1", False)
    waiter = Ticket()
    assert schedule.arrive(waiter) == []
    assert schedule.any_alive()  # e1 may still come back
    schedule.set_up("e1", False, alive=False)
    assert not schedule.any_alive()
    assert schedule.abandon_all() == [waiter] and schedule.waiting == 0


def test_concurrency_per_engine_spreads_load_before_stacking() -> None:
    schedule = Schedule(["e0", "e1"], max_concurrency=2)
    assert given(schedule.arrive(Ticket())) == ["e0"]
    assert given(schedule.arrive(Ticket())) == ["e1"]  # the idle engine before a second slot on e0
    assert given(schedule.arrive(Ticket())) == ["e0"]
    assert given(schedule.arrive(Ticket())) == ["e1"]
    assert schedule.arrive(Ticket()) == [] and schedule.capacity == 4


def test_only_so_many_conversations_are_remembered() -> None:
    schedule = Schedule(["e0"], remembered=2)
    for name in "ABC":
        schedule.arrive(Ticket(name))
        schedule.release("e0")
    assert schedule.engine_of("A") is None and schedule.engine_of("C") == "e0"


def test_a_schedule_needs_distinct_engines() -> None:
    with pytest.raises(ValueError):
        Schedule([])
    with pytest.raises(ValueError):
        Schedule(["e0", "e0"])
    with pytest.raises(ValueError):
        Schedule(["e0"]).release("e0")


# --- the asyncio pool ---------------------------------------------------------------------


async def settle() -> None:
    """Let every task that can run, run (the pool is in-process: no I/O to wait for)."""
    for _ in range(10):
        await asyncio.sleep(0)


class FakeEngines:
    """Readiness gates for named engines, standing in for supervisors."""

    def __init__(self, *names: str) -> None:
        self.gates = {name: asyncio.Event() for name in names}
        self.failed: set[str] = set()
        for gate in self.gates.values():
            gate.set()

    def member(self, name: str) -> PoolEngine:
        async def ready() -> None:
            if name in self.failed:
                raise EngineUnavailableError(f"{name} gave up")
            await self.gates[name].wait()

        return PoolEngine(name, EngineTarget(name, f"http://{name}", "key-" + name), ready)

    def pool(self, **kw: float) -> EnginePool:
        return EnginePool([self.member(name) for name in self.gates], **kw)  # type: ignore[arg-type]


async def hold(
    pool: EnginePool, conversation: str | None, served: list[tuple[str, str]], label: str, release: asyncio.Event
) -> None:
    async with pool(NO_REQUEST, conversation) as target:
        assert target is not None
        served.append((label, target.name))
        await release.wait()


async def test_two_engines_serve_two_requests_at_once_and_the_third_waits() -> None:
    pool = FakeEngines("e0", "e1").pool()
    served: list[tuple[str, str]] = []
    release = asyncio.Event()
    tasks = [asyncio.create_task(hold(pool, c, served, c, release)) for c in "ABC"]
    await settle()
    assert served == [("A", "e0"), ("B", "e1")] and pool.active == 2 and pool.waiting == 1
    release.set()
    await asyncio.gather(*tasks)
    assert served[2][0] == "C" and pool.active == 0 and pool.waiting == 0


async def test_a_follow_up_goes_to_the_engine_of_its_conversation() -> None:
    pool = FakeEngines("e0", "e1").pool()
    served: list[tuple[str, str]] = []
    done = asyncio.Event()
    done.set()
    for label in ("A", "B", "B", "A", "B"):
        await hold(pool, label, served, label, done)
    assert served == [("A", "e0"), ("B", "e1"), ("B", "e1"), ("A", "e0"), ("B", "e1")]


async def test_past_all_engines_and_the_queue_a_request_is_refused() -> None:
    pool = FakeEngines("e0", "e1").pool(max_queue=1)
    release = asyncio.Event()
    tasks = [asyncio.create_task(hold(pool, None, [], str(i), release)) for i in range(3)]
    await settle()
    assert pool.active == 2 and pool.waiting == 1
    with pytest.raises(QueueFullError) as refused:
        async with pool(NO_REQUEST, None):
            pass
    assert refused.value.status == 429 and refused.value.retry_after is not None
    release.set()
    await asyncio.gather(*tasks)


async def test_a_waiter_that_leaves_frees_its_place_and_the_engine_goes_to_the_next() -> None:
    pool = FakeEngines("e0", "e1").pool(max_queue=2)
    served: list[tuple[str, str]] = []
    first, release = asyncio.Event(), asyncio.Event()
    running = [asyncio.create_task(hold(pool, c, served, c, first)) for c in "AB"]
    await settle()
    leaver = asyncio.create_task(hold(pool, "L", served, "L", release))
    stayer = asyncio.create_task(hold(pool, "S", served, "S", release))
    await settle()
    assert pool.waiting == 2
    leaver.cancel()
    await settle()
    assert pool.waiting == 1 and leaver.cancelled()
    first.set()
    release.set()
    await asyncio.gather(*running, stayer)
    assert [label for label, _ in served] == ["A", "B", "S"] and pool.active == 0


async def test_one_engine_failing_while_the_other_serves() -> None:
    engines = FakeEngines("e0", "e1")
    pool = engines.pool(ready_timeout=5)
    served: list[tuple[str, str]] = []
    done = asyncio.Event()
    done.set()
    await hold(pool, "A", served, "A", done)  # A's engine is e0
    # e0 crashes: its supervisor says so, and it restarts (not ready for a while).
    engines.gates["e0"].clear()
    pool.set_up("e0", False)
    for _ in range(3):
        await hold(pool, "A", served, "A", done)
    assert [name for _, name in served] == ["e0", "e1", "e1", "e1"]
    # Then it gives up for good: e1 still serves everything.
    engines.failed.add("e0")
    pool.set_up("e0", False, alive=False)
    await hold(pool, "B", served, "B", done)
    assert served[-1] == ("B", "e1")


async def test_a_request_waits_for_the_first_engine_to_be_ready() -> None:
    engines = FakeEngines("e0", "e1")
    for gate in engines.gates.values():
        gate.clear()
    pool = engines.pool(ready_timeout=5)
    pool.set_up("e0", False)
    pool.set_up("e1", False)
    served: list[tuple[str, str]] = []
    release = asyncio.Event()
    task = asyncio.create_task(hold(pool, None, served, "a", release))
    await settle()
    assert served == [] and pool.waiting == 1
    engines.gates["e1"].set()
    pool.set_up("e1", True)
    await settle()
    assert served == [("a", "e1")]
    release.set()
    await task


async def test_no_ready_engine_within_the_wait_is_a_503() -> None:
    engines = FakeEngines("e0", "e1")
    for gate in engines.gates.values():
        gate.clear()
    pool = engines.pool(ready_timeout=0.05)
    with pytest.raises(EngineUnavailableError, match=r"did not become ready within 0\.05s") as refused:
        async with pool(NO_REQUEST, None):
            pass
    assert refused.value.status == 503 and pool.waiting == 0


async def test_every_engine_failed_is_a_503_at_once_for_new_and_waiting_requests() -> None:
    engines = FakeEngines("e0", "e1")
    pool = engines.pool(ready_timeout=60)
    served: list[tuple[str, str]] = []
    release = asyncio.Event()
    running = [asyncio.create_task(hold(pool, None, served, str(i), release)) for i in range(2)]
    waiter = asyncio.create_task(hold(pool, None, served, "w", release))
    await settle()
    assert pool.waiting == 1
    for name in ("e0", "e1"):
        engines.failed.add(name)
        pool.set_up(name, False, alive=False)
    with pytest.raises(EngineUnavailableError, match="every engine has stopped"):
        await waiter
    with pytest.raises(EngineUnavailableError, match="gave up"):
        async with pool(NO_REQUEST, None):
            pass
    release.set()
    await asyncio.gather(*running)
