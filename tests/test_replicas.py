"""Replicas behind the real nginx, with config/deploy/nginx.conf, and a shared real Redis.

The topology of scripts/scale_check.sh (bench/replicas.py): redis-server, two ``toolpair
proxy`` processes each in front of its own mock engine, nginx in front of both. Checked
here: the conversation key nginx hashes on (each header form real clients send, their
precedence, the fallback), and a short run of the scale check itself, with a replica killed
mid-load.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_replicas", ROOT / "bench" / "replicas.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _bench()
# Every header nginx.conf reads a conversation from, in its order of precedence.
CONVERSATION_HEADERS = (
    "X-Toolpair-Conversation",
    "X-Claude-Code-Session-Id",
    "session_id",
    "session-id",
    "conversation_id",
    "X-Session-Affinity",
    "X-Session-Id",
)


@pytest.fixture(scope="module")
def topology() -> Iterator[Any]:
    workdir = Path(tempfile.mkdtemp(prefix="toolpair-replicas-"))
    running = bench.Topology(workdir, bench.RedisServer(workdir / "redis"))
    try:
        asyncio.run(running.start(2, 3, 0.0))
        yield running
    finally:
        running.stop()


async def replica_for(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        assert (await response.json())["choices"][0]["message"]["content"] == "seen=1 ok"
        return str(response.headers["X-Toolpair-Replica"])


async def test_each_conversation_header_keeps_a_conversation_on_one_replica(topology: Any) -> None:
    used: set[str] = set()
    async with aiohttp.ClientSession() as session:
        for header in CONVERSATION_HEADERS:
            for _ in range(6):
                key = uuid.uuid4().hex
                replicas = {await replica_for(session, topology.url, {header: key}) for _ in range(3)}
                assert len(replicas) == 1, (header, replicas)
                used |= replicas
    assert used == set(topology.replicas)  # 42 keys: both replicas get conversations


async def test_the_first_header_in_precedence_decides_and_no_header_falls_back_to_the_address(topology: Any) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(8):
            explicit, other = uuid.uuid4().hex, uuid.uuid4().hex
            alone = await replica_for(session, topology.url, {"X-Toolpair-Conversation": explicit})
            both = {"X-Toolpair-Conversation": explicit, "X-Claude-Code-Session-Id": other, "session_id": other}
            assert await replica_for(session, topology.url, both) == alone
            codex = await replica_for(session, topology.url, {"session_id": other})
            assert await replica_for(session, topology.url, {"session-id": other}) == codex  # both spellings
        anonymous = {await replica_for(session, topology.url, {}) for _ in range(6)}
        assert len(anonymous) == 1  # same client address, same replica


def test_the_deploy_nginx_conf_passes_nginx_t(tmp_path: Path) -> None:
    conf = tmp_path / "nginx.conf"
    text = (ROOT / "config" / "deploy" / "nginx.conf").read_text()
    conf.write_text(bench.render_nginx_conf(text, 18787, [18788, 18789], tmp_path))
    for kind in bench._NGINX_TEMP:
        (tmp_path / kind).mkdir()
    checked = subprocess.run(
        [bench._binary("nginx"), "-t", "-p", str(tmp_path), "-c", str(conf), "-e", str(tmp_path / "error.log")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert checked.returncode == 0, checked.stderr
    assert "syntax is ok" in checked.stderr


def test_scale_check_short_run_meets_every_target(tmp_path: Path) -> None:
    report_file = tmp_path / "report.json"
    script = str(ROOT / "scripts" / "scale_check.sh")
    run = subprocess.run(
        [script, "--conversations", "12", "--turns", "4", "--report", str(report_file)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(report_file.read_text())
    assert report["errors"] == 0 and report["turns_completed"] == report["turns_planned"] == 48
    assert report["continuations_across_replicas"] > 0
    assert report["continuations_across_replicas_found"] == report["continuations_across_replicas"]
    assert report["stayed_on_one_replica"] + report["moved_once_by_the_kill"] == report["sticky_conversations"]
    assert report["scattered"] == 0
    kill = report["kill"]
    assert kill["replica"] in report["replicas"] and kill["failed_requests"] == kill["failed_cleanly"]
    assert kill["retried_and_answered"] == kill["retries"]
    assert report["stored_responses"] > 0
    assert report["stored_responses_readable_after"] == report["stored_responses"]
    assert set(report["requests_per_replica"]) == set(report["replicas"])
    assert "PASS" in run.stdout
