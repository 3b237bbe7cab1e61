"""Two toolpair replicas behind nginx with a shared Redis store, on loopback, under a bounded load.

The topology of ``config/deploy/docker-compose.yml`` (profile ``replicas``) without Docker:
``redis-server`` and ``nginx`` from the system, two ``toolpair proxy`` replicas, each in
front of its own mock engine (which starts every reply with ``seen=N``, the number of
messages it received, so a turn shows whether its history arrived). nginx runs the deploy
configuration itself, rewritten only for loopback ports and private paths.

The load: concurrent multi-turn conversations, Responses (``previous_response_id``,
stored in Redis) and Chat (the client resends its history), streamed and not. Most send a
stable session header, in the forms real clients use; some Responses conversations send a
new key each turn, so their continuations land on either replica and must find their
history in Redis. Half-way through, while streams are in flight on it, replica 1 is killed
(SIGKILL); each turn that fails is retried once, as SDKs do.

Reported: requests, errors (target 0), continuations found across replicas (target all),
conversations that stayed on one replica, what the kill did, and whether every stored
response is still readable. Exit status 0 when every target is met.

Run: ``scripts/scale_check.sh`` (``--help`` for the sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.redis_server import RedisServer, free_port  # noqa: E402 - after the path is set

DEPLOY_NGINX = ROOT / "config" / "deploy" / "nginx.conf"
# Header forms that name a conversation, as clients send them (nginx.conf reads each).
SESSION_HEADERS = ("X-Claude-Code-Session-Id", "session_id", "session-id", "X-Toolpair-Conversation")


# --- the topology ----------------------------------------------------------------------------------


_NGINX_TEMP = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")


def render_nginx_conf(text: str, listen_port: int, replica_ports: list[int], workdir: Path) -> str:
    """The deploy nginx.conf with loopback addresses, and logs and temp files under ``workdir``."""
    servers = re.findall(r"server toolpair-\d+:8787", text)
    if len(servers) != len(replica_ports):
        raise ValueError(f"nginx.conf names {len(servers)} replicas, the check runs {len(replica_ports)}")
    for server, port in zip(servers, replica_ports, strict=True):
        text = text.replace(server, f"server 127.0.0.1:{port}", 1)
    text, listens = re.subn(r"listen 8787;", f"listen 127.0.0.1:{listen_port};", text)
    if listens != 1:
        raise ValueError("nginx.conf must listen on 8787 once")
    text = text.replace("/dev/stdout", str(workdir / "access.log")).replace("/dev/stderr", str(workdir / "error.log"))
    text = text.replace("worker_processes auto;", "worker_processes 2;")
    temp = "".join(f"\n    {kind}_temp_path {workdir / kind};" for kind in _NGINX_TEMP)
    return text.replace("http {", "http {" + temp, 1)


def _binary(name: str) -> str:
    places = (f"/usr/sbin/{name}", f"/usr/bin/{name}")
    found = shutil.which(name) or next((place for place in places if os.path.exists(place)), None)
    if found is None:
        raise SystemExit(f"{name} is not installed: apt-get install {name} (make scale-check does it)")
    return found


async def _wait_http(url: str, process: subprocess.Popen[bytes], what: str, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"{what} exited with {process.returncode} while starting")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as response:
                    if response.status < 500:
                        return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{what} did not answer {url} within {within:g} s")


@dataclass
class Topology:
    workdir: Path
    redis: RedisServer
    url: str = ""
    replicas: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)  # "127.0.0.1:PORT" -> process
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def spawn(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        log = (self.workdir / f"{name}.log").open("wb")
        process = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.children.append(process)
        return process

    async def start(self, replicas: int, words: int, delay: float) -> None:
        self.redis.start()
        replica_ports = []
        for index in range(1, replicas + 1):
            engine_port, replica_port = free_port(), free_port()
            engine_args = ["-m", "tests.mock_engine", "--port", str(engine_port), "--echo-count"]
            engine_args += ["--words", str(words), "--delay", str(delay)]
            engine = self.spawn([sys.executable, *engine_args], f"engine-{index}")
            await _wait_http(f"http://127.0.0.1:{engine_port}/v1/models", engine, f"mock engine {index}")
            replica_args = ["-m", "proxy", "proxy", "--upstream", f"http://127.0.0.1:{engine_port}"]
            replica_args += ["--port", str(replica_port), "--responses-store", self.redis.url, "--log-level", "warning"]
            replica = self.spawn([sys.executable, *replica_args], f"toolpair-{index}")
            await _wait_http(f"http://127.0.0.1:{replica_port}/health", replica, f"toolpair replica {index}")
            self.replicas[f"127.0.0.1:{replica_port}"] = replica
            replica_ports.append(replica_port)
        nginx_port = free_port()
        for kind in _NGINX_TEMP:
            (self.workdir / kind).mkdir(mode=0o777, exist_ok=True)
            (self.workdir / kind).chmod(0o777)  # nginx's workers may run as another user when started as root
        self.workdir.chmod(0o755)
        conf = self.workdir / "nginx.conf"
        conf.write_text(render_nginx_conf(DEPLOY_NGINX.read_text(), nginx_port, replica_ports, self.workdir))
        nginx_args = [_binary("nginx"), "-p", str(self.workdir), "-c", str(conf), "-e", str(self.workdir / "error.log")]
        nginx = self.spawn([*nginx_args, "-g", f"daemon off; pid {self.workdir / 'nginx.pid'};"], "nginx")
        self.url = f"http://127.0.0.1:{nginx_port}"
        await _wait_http(self.url + "/health", nginx, "nginx")

    def kill(self, replica: str) -> None:
        process = self.replicas[replica]
        process.send_signal(signal.SIGKILL)
        process.wait(10)

    def stop(self) -> None:
        for process in reversed(self.children):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self.children):
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self.redis.stop()


# --- the load ----------------------------------------------------------------------------------


@dataclass
class Turn:
    conversation: int
    kind: str  # responses | chat
    turn: int
    attempt: int
    stream: bool
    ok: bool = False
    replica: str = ""
    status: int = 0
    failure: str = ""  # empty when ok: http-503-replica_unavailable, cut-stream, wrong-history, ...
    started: float = 0.0
    finished: float = 0.0
    previous_replica: str = ""  # responses continuations: the replica that answered the turn before
    response_id: str = ""


@dataclass
class Load:
    conversations: int
    turns: int
    roaming_every: int = 4  # every Nth Responses conversation sends a new key each turn
    kill_at: float = 0.5  # fraction of the planned turns done before replica 1 is killed
    kill: bool = True
    results: list[Turn] = field(default_factory=list)
    streaming: Counter[str] = field(default_factory=Counter)  # replica -> streams in flight
    done: int = 0
    kill_time: float | None = None
    killed: str = ""
    in_flight_at_kill: int = 0
    tick: asyncio.Event = field(default_factory=asyncio.Event)  # set whenever a turn ends or a stream starts

    async def until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            self.tick.clear()
            await self.tick.wait()


def _replica(headers: Any) -> str:
    """The replica that answered: the last address nginx tried."""
    return str(headers.get("X-Toolpair-Replica", "")).split(",")[-1].strip()


def _seen(text: str) -> int:
    found = re.match(r"seen=(\d+)", text)
    return int(found.group(1)) if found else -1


_PATHS = {"responses": "/v1/responses", "chat": "/v1/chat/completions"}


def _answer(kind: str, data: dict[str, Any], turn: Turn) -> str:
    """The text of a whole (not streamed) answer."""
    if kind == "chat":
        return str(data["choices"][0]["message"]["content"])
    turn.response_id = data["id"]
    return str(data["output"][0]["content"][0]["text"])


async def _streamed_answer(kind: str, response: aiohttp.ClientResponse, turn: Turn) -> str:
    """The text of a streamed answer; a stream without its final event is a failure."""
    text, completed = "", None
    async for line in response.content:
        if line.startswith(b"data: [DONE]"):
            completed = {}
        elif line.startswith(b"data: "):
            event = orjson.loads(line[6:])
            if kind == "chat":
                text += "".join(choice.get("delta", {}).get("content") or "" for choice in event.get("choices", []))
            elif event["type"] == "response.completed":
                completed = event["response"]
    if completed is None:
        turn.failure = "stream-ended-without-its-last-event"
        return ""
    return text if kind == "chat" else _answer(kind, completed, turn)


async def _turn(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], headers: dict[str, str], turn: Turn, load: Load
) -> str:
    """Text of the answer; ``turn`` is filled in."""
    async with session.post(url + _PATHS[turn.kind], json=body, headers=headers) as response:
        turn.status, turn.replica = response.status, _replica(response.headers)
        if response.status != 200:
            error = (await response.json(content_type=None)).get("error", {})
            turn.failure = f"http-{response.status}-{error.get('code')}"
            return ""
        if not turn.stream:
            return _answer(turn.kind, await response.json(), turn)
        load.streaming[turn.replica] += 1
        load.tick.set()
        try:
            return await _streamed_answer(turn.kind, response, turn)
        finally:
            load.streaming[turn.replica] -= 1


def roams(index: int, load: Load) -> bool:
    """Every ``roaming_every``-th Responses conversation (even indexes) sends a new key each turn."""
    return index % 2 == 0 and (index // 2) % load.roaming_every == load.roaming_every - 1


async def conversation(session: aiohttp.ClientSession, url: str, index: int, load: Load) -> None:
    kind = "responses" if index % 2 == 0 else "chat"
    roaming = roams(index, load)
    header = SESSION_HEADERS[index % len(SESSION_HEADERS)]
    key = f"conv-{index}-{uuid.uuid4().hex[:8]}"
    history: list[dict[str, Any]] = []
    previous_id, previous_replica = "", ""
    for number in range(1, load.turns + 1):
        question = f"conversation {index} turn {number}"
        for attempt in (1, 2):
            stream = (index + number) % 2 == 0
            turn = Turn(index, kind, number, attempt, stream, started=time.monotonic())
            headers = {"X-Toolpair-Conversation" if roaming else header: uuid.uuid4().hex if roaming else key}
            if kind == "responses":
                body: dict[str, Any] = {"model": "mock", "input": question, "stream": stream}
                if previous_id:
                    body["previous_response_id"] = previous_id
                    turn.previous_replica = previous_replica
            else:
                messages = [*history, {"role": "user", "content": question}]
                body = {"model": "mock", "messages": messages, "stream": stream}
            try:
                text = await _turn(session, url, body, headers, turn, load)
                if not turn.failure and _seen(text) != 2 * number - 1:
                    turn.failure = f"wrong-history: engine saw {_seen(text)} messages, expected {2 * number - 1}"
            except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError) as exc:
                turn.failure = f"cut-stream ({type(exc).__name__})"
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as exc:
                turn.failure = f"client-error ({type(exc).__name__}: {exc})"
            turn.finished = time.monotonic()
            turn.ok = not turn.failure
            load.results.append(turn)
            load.done += 1
            load.tick.set()
            if turn.ok:
                if kind == "responses":
                    previous_id, previous_replica = turn.response_id, turn.replica
                else:
                    history += [{"role": "user", "content": question}, {"role": "assistant", "content": text}]
                break
            await asyncio.sleep(0.2)  # an SDK's retry pause
        else:
            return  # two failures: this conversation stops (reported as an error)


async def killer(topology: Topology, load: Load) -> None:
    """Kill replica 1 once enough turns are done and a stream is in flight on it."""
    victim = next(iter(topology.replicas))
    planned = load.conversations * load.turns
    await load.until(lambda: load.done >= planned * load.kill_at)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(5):
            await load.until(lambda: load.streaming[victim] > 0)
    load.in_flight_at_kill = load.streaming[victim]
    load.kill_time = time.monotonic()
    load.killed = victim
    topology.kill(victim)


async def read_back(session: aiohttp.ClientSession, url: str, ids: list[str]) -> int:
    """How many of ``ids`` the store still returns, read through nginx."""
    found = 0
    for response_id in ids:
        async with session.get(f"{url}/v1/responses/{response_id}") as response:
            found += response.status == 200
    return found


def summarize(load: Load, replicas: list[str], readable: int, seconds: float) -> dict[str, Any]:
    results = load.results
    by_kill = [
        t
        for t in results
        if not t.ok
        and load.kill_time is not None
        and t.finished >= load.kill_time
        and (t.replica in ("", load.killed) or "replica_unavailable" in t.failure)
    ]
    clean = [
        t
        for t in by_kill
        if t.failure.startswith(("cut-stream", "stream-ended-without", "http-503-replica_unavailable"))
    ]
    errors = [t for t in results if not t.ok and t not in by_kill]
    retried = [t for t in results if t.attempt == 2]
    finished = {(t.conversation, t.turn) for t in results if t.ok}
    # A continuation cut by the kill is counted with the kill; its retry is counted here.
    continuations = [t for t in results if t.kind == "responses" and t.previous_replica and t not in by_kill]
    across = [t for t in continuations if t.replica != t.previous_replica]
    stored = [t.response_id for t in results if t.ok and t.response_id]

    sticky: dict[int, list[Turn]] = {}
    for t in results:
        if t.ok and not roams(t.conversation, load):
            sticky.setdefault(t.conversation, []).append(t)
    stayed = moved_by_kill = scattered = 0
    for turns in sticky.values():
        turns.sort(key=lambda t: t.turn)
        runs = [t for i, t in enumerate(turns) if i == 0 or t.replica != turns[i - 1].replica]  # first turn of each run
        if len(runs) == 1:
            stayed += 1
        elif len(runs) == 2 and runs[0].replica == load.killed and runs[1].finished >= (load.kill_time or 0):
            moved_by_kill += 1
        else:
            scattered += 1
    report = {
        "conversations": load.conversations,
        "turns_each": load.turns,
        "requests": len(results),
        "requests_per_replica": dict(Counter(t.replica for t in results if t.replica)),
        "seconds": round(seconds, 2),
        "errors": len(errors),
        "error_samples": [asdict(t) for t in errors[:5]],
        "turns_completed": len(finished),
        "turns_planned": load.conversations * load.turns,
        "continuations": len(continuations),
        "continuations_across_replicas": len(across),
        "continuations_across_replicas_found": sum(t.ok for t in across),
        "sticky_conversations": len(sticky),
        "stayed_on_one_replica": stayed,
        "moved_once_by_the_kill": moved_by_kill,
        "scattered": scattered,
        "kill": {
            "replica": load.killed,
            "streams_in_flight_on_it": load.in_flight_at_kill,
            "failed_requests": len(by_kill),
            "failed_cleanly": len(clean),
            "failures": dict(Counter(t.failure.split(" ")[0] for t in by_kill)),
            "retried_and_answered": sum(t.ok for t in retried),
            "retries": len(retried),
        },
        "stored_responses": len(stored),
        "stored_responses_readable_after": readable,
        "replicas": replicas,
    }
    report["passed"] = (
        not errors
        and len(finished) == report["turns_planned"]
        and len(across) > 0
        and all(t.ok for t in across)
        and scattered == 0
        and len(clean) == len(by_kill)
        and readable == len(stored)
        and (not load.kill or load.kill_time is not None)
    )
    return report


async def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="toolpair-scale-"))
    topology = Topology(workdir, RedisServer(workdir / "redis"))
    try:
        await topology.start(2, args.words, args.delay)
        load = Load(args.conversations, args.turns, kill=not args.no_kill)
        timeout = aiohttp.ClientTimeout(total=args.request_timeout)
        connector = aiohttp.TCPConnector(limit=0, force_close=True)  # one connection per request, like many clients
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            started = time.monotonic()
            tasks = [conversation(session, topology.url, index, load) for index in range(args.conversations)]
            if load.kill:
                tasks.append(killer(topology, load))
            await asyncio.gather(*tasks)
            seconds = time.monotonic() - started
            stored = [t.response_id for t in load.results if t.ok and t.response_id]
            readable = await read_back(session, topology.url, stored)
        report = summarize(load, list(topology.replicas), readable, seconds)
        report["workdir"] = str(workdir)
        return report
    finally:
        topology.stop()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def print_report(report: dict[str, Any]) -> None:
    kill = report["kill"]
    rows = {
        "requests": f"{report['requests']} in {report['seconds']} s, per replica {report['requests_per_replica']}",
        "errors": f"{report['errors']}  (target 0)",
        "turns completed": f"{report['turns_completed']} / {report['turns_planned']}",
        "continuations across replicas": (
            f"{report['continuations_across_replicas_found']} found / {report['continuations_across_replicas']}"
            f"  (target all; {report['continuations']} continuations in all)"
        ),
        "conversations on one replica": (
            f"{report['stayed_on_one_replica']} / {report['sticky_conversations']} with a stable session header;"
            f" {report['moved_once_by_the_kill']} moved once, by the kill; {report['scattered']} scattered (target 0)"
        ),
        "replica killed mid-load": (
            f"{kill['replica']}: {kill['streams_in_flight_on_it']} streams in flight;"
            f" {kill['failed_requests']} requests failed, {kill['failed_cleanly']} cleanly {kill['failures']};"
            f" retried {kill['retries']}, answered {kill['retried_and_answered']}"
        ),
        "stored responses readable after": (
            f"{report['stored_responses_readable_after']} / {report['stored_responses']}  (nothing lost)"
        ),
        "result": "PASS" if report["passed"] else "FAIL",
    }
    for name, value in rows.items():
        print(f"{name:<33}{value}")
    for sample in report["error_samples"]:
        print(f"  error: {sample}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=48, help="concurrent conversations (default 48)")
    parser.add_argument("--turns", type=int, default=6, help="turns per conversation (default 6)")
    parser.add_argument("--words", type=int, default=8, help="chunks per streamed reply (default 8)")
    parser.add_argument("--delay", type=float, default=0.03, help="seconds between streamed chunks (default 0.03)")
    parser.add_argument("--request-timeout", type=float, default=30.0, help="seconds before a request counts as hung")
    parser.add_argument("--no-kill", action="store_true", help="do not kill a replica")
    parser.add_argument("--report", metavar="FILE", help="also write the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, nginx.conf)")
    args = parser.parse_args(argv)
    report = asyncio.run(run(args))
    print_report(report)
    if args.report:
        Path(args.report).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
