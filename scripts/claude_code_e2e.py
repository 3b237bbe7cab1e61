"""Manual end-to-end check: Claude Code -> toolpair -> a scripted engine (not part of `make test`).

Needs the Claude Code CLI (`npm i -g @anthropic-ai/claude-code`). Runs one
non-interactive turn, `claude -p ... --allowedTools Grep`, against toolpair in
translate mode. The scripted engine answers the first tool-enabled request with
two parallel Grep calls, a slow one (a large directory) and a fast one (a tiny
one), so Claude Code sends the results back in the order they finished. The
script then prints what Claude Code sent toolpair and what the engine got.

    .venv/bin/python scripts/claude_code_e2e.py [--claude claude] [--slow-dir /usr]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.app import create_app
from proxy.config import Settings
from tests.conftest import start_app


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"id": "c", "object": "chat.completion.chunk", "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}  # fmt: skip
    return b"data: " + orjson.dumps(body) + b"\n\n"


class Engine:
    """Streams two parallel Grep calls for the first request with tools, then plain text."""

    def __init__(self, slow_dir: str, fast_dir: str) -> None:
        self.slow_dir, self.fast_dir = slow_dir, fast_dir
        self.received: list[dict[str, Any]] = []
        self.called = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if not raw:
            return web.json_response({"object": "list", "data": []})
        body = orjson.loads(raw)
        self.received.append({"path": request.path, "body": body})
        names = [t["function"]["name"] for t in body.get("tools", [])]
        if "Grep" in names and not self.called:
            self.called = True
            calls = [
                {"index": 0, "id": "call_slow", "type": "function",
                 "function": {"name": "Grep", "arguments": json.dumps({"pattern": "import", "path": self.slow_dir})}},
                {"index": 1, "id": "call_fast", "type": "function",
                 "function": {"name": "Grep", "arguments": json.dumps({"pattern": "needle", "path": self.fast_dir})}},
            ]  # fmt: skip
            frames = [chunk({"role": "assistant", "content": "Searching both."})]
            frames += [chunk({"tool_calls": [call]}) for call in calls] + [chunk({}, "tool_calls")]
        else:
            frames = [chunk({"role": "assistant", "content": "Both searches are done."}), chunk({}, "stop")]
        if not body.get("stream"):
            text = "Both searches are done."
            reply = {"id": "c", "object": "chat.completion", "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}  # fmt: skip
            return web.json_response(reply)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for frame in frames:
            await response.write(frame)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def main(claude: str, slow_dir: str) -> int:
    work = Path(tempfile.mkdtemp(prefix="toolpair-cc-"))
    fast_dir = work / "small"
    fast_dir.mkdir()
    (fast_dir / "a.txt").write_text("needle\n")
    engine = Engine(slow_dir, str(fast_dir))
    engine_app = web.Application(client_max_size=1 << 28)
    engine_app.router.add_route("*", "/{tail:.*}", engine.handle)
    engine_runner, engine_url = await start_app(engine_app)

    app = create_app(Settings(upstream=engine_url, messages_mode="translate"))
    runner, toolpair_url = await start_app(app)

    # A recorder in front of toolpair keeps what Claude Code itself sent.
    seen: list[dict[str, Any]] = []
    session = aiohttp.ClientSession(auto_decompress=False)

    async def record(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        if request.path.startswith("/v1/messages") and raw:
            seen.append({"path": request.path_qs, "headers": dict(request.headers), "body": orjson.loads(raw)})
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with session.request(request.method, toolpair_url + request.path_qs, data=raw, headers=headers) as up:
            out = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "")})
            await out.prepare(request)
            async for piece in up.content.iter_any():
                await out.write(piece)
            await out.write_eof()
            return out

    recorder = web.Application(client_max_size=1 << 28)
    recorder.router.add_route("*", "/{tail:.*}", record)
    recorder_runner, url = await start_app(recorder)
    env = {
        **os.environ,
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-ant-local-test",
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CONFIG_DIR": str(work / "config"),
    }
    command = [claude, "-p", "Search for imports and for needle.", "--allowedTools", "Grep", "--output-format", "json"]
    process = await asyncio.create_subprocess_exec(
        *command, env=env, cwd=work, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 300)
    await recorder_runner.cleanup()
    await session.close()
    await runner.cleanup()
    await engine_runner.cleanup()
    shutil.rmtree(work, ignore_errors=True)

    print(f"claude exit code {process.returncode}")
    print("claude stdout:", out.decode(errors="replace")[:2000])
    if err:
        print("claude stderr:", err.decode(errors="replace")[-2000:])
    if seen:
        first = seen[0]["body"]
        print("\nfields of Claude Code's first request:", sorted(first))
        print("  thinking:", first.get("thinking"), "output_config:", first.get("output_config"))
        print("  context_management:", first.get("context_management"), "metadata keys:", list(first.get("metadata", {})))
        print("  tools with defer_loading:", [t["name"] for t in first.get("tools", []) if t.get("defer_loading")])
        print("  system block starts:", [str(b.get("text", ""))[:60] for b in first.get("system", [])])
    print(f"\n{len(seen)} Anthropic requests from Claude Code:")
    for item in seen:
        body = item["body"]
        print(f"  {item['path']}: stream={body.get('stream')} tools={len(body.get('tools', []))} "
              f"messages={[m.get('role') for m in body.get('messages', [])]} "
              f"beta={item['headers'].get('anthropic-beta')}")  # fmt: skip
        for message in body.get("messages", []):
            if isinstance(message.get("content"), list):
                ids = [b.get("tool_use_id") for b in message["content"] if b.get("type") == "tool_result"]
                if ids:
                    print(f"    tool_result order as sent by Claude Code: {ids}")
    print(f"\n{len(engine.received)} chat requests at the engine:")
    for item in engine.received:
        messages = item["body"]["messages"]
        tool_ids = [m.get("tool_call_id") for m in messages if m.get("role") == "tool"]
        print(f"  roles={[m['role'] for m in messages]} tool order={tool_ids}")
    return 0 if process.returncode == 0 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--claude", default="claude", help="the Claude Code command")
    parser.add_argument("--slow-dir", default="/usr", help="a large directory, so one Grep takes a while")
    args = parser.parse_args()
    sys.exit(asyncio.run(main(args.claude, args.slow_dir)))
