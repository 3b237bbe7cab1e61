"""``toolpair proxy --host A,B`` listens on each address, as llama-server's ``--host`` does (issue 27).

llama.cpp's server suite starts its server on ``127.0.0.1,::1`` and talks to both; toolpair put on that
address in its place must answer on both, or the suite's test fails through toolpair and passes direct.
"""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from tests.sidecar.llama_server import NEEDS_LLAMA_SERVER, TINY_BODIES, SidecarStack, module_stack, start_sidecar
from tests.support.network import has_ipv6_loopback

pytestmark = [
    NEEDS_LLAMA_SERVER,
    pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback"),
]


class Stack(SidecarStack):
    """llama-server <- recording hop <- toolpair proxy on 127.0.0.1 and ::1."""

    def start_sidecars(self, upstream: str) -> None:
        self.sidecar = self.keep(start_sidecar(self.tmp, upstream, "--host", "127.0.0.1,::1"))


stack = module_stack(Stack, "listen-addresses")


@pytest.mark.parametrize("address", ["127.0.0.1", "[::1]"])
async def test_each_address_answers_probes_passthrough_and_chat(stack: Stack, address: str) -> None:
    port = stack.sidecar.url.rsplit(":", 1)[1]
    base = f"http://{address}:{port}"
    chat = {**TINY_BODIES["/v1/chat/completions"], "model": "m"}
    async with aiohttp.ClientSession() as session:
        async with session.get(base + "/health") as response:
            assert response.status == 200
        async with session.get(base + "/v1/models") as response:
            assert response.status == 200
            assert (await response.json())["data"]
        async with session.post(base + "/v1/chat/completions", data=orjson.dumps(chat)) as response:
            assert response.status == 200
            assert (await response.json())["choices"][0]["message"]
