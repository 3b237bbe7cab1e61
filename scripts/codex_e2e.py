"""Manual end-to-end check: Codex CLI -> toolpair (translate mode) -> mock chat engine.

Not part of ``make test``. Needs the Codex CLI (``npm i -g @openai/codex``, or set CODEX_BIN).
The mock answers Codex's first request with some reasoning and two parallel ``exec_command``
calls, streamed as chat chunks, and any request that carries tool results with a short text. The script
prints what the engine received and what Codex printed, and exits nonzero when the loop
did not complete.

    python scripts/codex_e2e.py
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import orjson
from aiohttp import web

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.app import create_app  # noqa: E402
from proxy.config import Settings  # noqa: E402
from tests.conftest import start_app  # noqa: E402
from tests.mock_engine import MockEngine, Received, chunk  # noqa: E402

COMMANDS = ["echo toolpair-one", "echo toolpair-two"]
ANSWER = "Both commands ran through toolpair."


async def codex_turn(request: web.Request, received: Received) -> web.StreamResponse:
    body = received.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    await response.write(chunk({"role": "assistant", "content": ""}))
    if any(m["role"] == "tool" for m in body["messages"]):
        await response.write(chunk({"content": ANSWER}))
        await response.write(chunk({}, "stop"))
    else:
        await response.write(chunk({"reasoning_content": "Two commands: run both at once."}))
        for index, command in enumerate(COMMANDS):
            call = {
                "index": index,
                "id": f"call_{index}",
                "type": "function",
                "function": {"name": "exec_command", "arguments": json.dumps({"cmd": command})},
            }
            await response.write(chunk({"tool_calls": [call]}))
        await response.write(chunk({}, "tool_calls"))
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def write_config(home: str, url: str) -> None:
    """A Codex provider entry pointing at toolpair (client-facts.md has the shape)."""
    Path(home, "config.toml").write_text(
        'model = "local-coder"\nmodel_provider = "toolpair"\n'
        "[model_providers.toolpair]\n"
        f'name = "toolpair"\nbase_url = "{url}/v1"\nwire_api = "responses"\nenv_key = "TOOLPAIR_KEY"\n'
    )


async def main() -> int:
    codex = os.environ.get("CODEX_BIN") or shutil.which("codex")
    if not codex:
        print("codex not found: npm i -g @openai/codex, or set CODEX_BIN", file=sys.stderr)
        return 2
    engine = MockEngine()
    await engine.start()
    for _ in range(4):
        engine.then(codex_turn)
    runner, url = await start_app(create_app(Settings(upstream=engine.url, responses_mode="translate")))
    with tempfile.TemporaryDirectory(prefix="toolpair-codex-") as home, tempfile.TemporaryDirectory() as work:
        write_config(home, url)
        env = {**os.environ, "CODEX_HOME": home, "TOOLPAIR_KEY": "local"}
        process = await asyncio.create_subprocess_exec(
            codex,
            "exec",
            "--skip-git-repo-check",
            "-s",
            "danger-full-access",
            "Run the two echo commands.",
            cwd=work,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        output, _ = await asyncio.wait_for(process.communicate(), 180)
    await runner.cleanup()
    await engine.stop()

    print("---- codex output")
    print(output.decode(errors="replace"))
    print("---- what the engine received")
    for number, received in enumerate(engine.received, 1):
        body = orjson.loads(received.body)
        roles = [m["role"] for m in body["messages"]]
        tools = [t["function"]["name"] for t in body.get("tools", [])]
        print(f"request {number}: {received.path} roles={roles}")
        print(f"  tools ({len(tools)}): {', '.join(tools)}")
        for message in body["messages"]:
            if message.get("reasoning_content"):
                print(f"  reasoning_content on an assistant message: {message['reasoning_content']!r}")
            if message["role"] == "tool":
                print(f"  tool result {message['tool_call_id']}: {message['content'][:120]!r}")
    results = [m for r in engine.received for m in orjson.loads(r.body)["messages"] if m["role"] == "tool"]
    ran = all(any(c.split()[-1] in str(m["content"]) for m in results) for c in COMMANDS)
    ok = process.returncode == 0 and ANSWER in output.decode(errors="replace") and ran
    print("---- result:", "loop completed" if ok else "loop did NOT complete")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
