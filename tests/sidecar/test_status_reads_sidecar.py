"""Reading the engine's state through ``toolpair proxy`` changes no metric (issue 27: reading is read-only).

A real llama-server (``--metrics --slots``) behind a recording hop behind ``toolpair proxy``. Agents and
dashboards poll ``/props``, ``/slots`` and ``/v1/models`` through toolpair; those reads reach llama-server,
and two ``/metrics`` scrapes with only such reads between them are the same bytes: toolpair's families
and llama-server's alike (once a first scrape has reset llama-server's since-the-last-scrape gauges).
"""

from __future__ import annotations

import aiohttp
import orjson

from tests.sidecar.llama_server import NEEDS_LLAMA_SERVER, TINY_BODIES, SidecarStack, module_stack, start_sidecar

pytestmark = NEEDS_LLAMA_SERVER

STATUS_READS = ("/props", "/slots", "/models", "/v1/models", "/v1/health", "/lora-adapters")
"""The paths llama-server answers with its state (``GET``), each forwarded by toolpair as it is."""


class Stack(SidecarStack):
    """llama-server <- recording hop <- toolpair proxy."""

    def start_sidecars(self, upstream: str) -> None:
        self.sidecar = self.keep(start_sidecar(self.tmp, upstream))


stack = module_stack(Stack, "status-reads", "--metrics", "--slots")


async def test_status_reads_between_two_scrapes_leave_them_the_same_bytes(stack: Stack) -> None:
    assert stack.hop is not None
    url = stack.sidecar.url
    async with aiohttp.ClientSession() as session:
        chat = {**TINY_BODIES["/v1/chat/completions"], "model": "m"}
        async with session.post(url + "/v1/chat/completions", data=orjson.dumps(chat)) as response:
            assert response.status == 200  # labelled series and histograms on both sides to compare
            await response.read()

        async def scrape() -> bytes:
            async with session.get(url + "/metrics") as response:
                assert response.status == 200
                return await response.read()

        await scrape()  # llama-server's tokens/s gauges cover the time since its last scrape: settle them
        first = await scrape()
        assert b"toolpair_requests_total{" in first and b"llamacpp:" in first  # both sides are in the scrape
        seen = len(stack.hop.sent)
        for path in STATUS_READS:
            for method in ("GET", "HEAD"):
                async with session.request(method, url + path) as response:
                    assert response.status == 200, (method, path)
                    await response.read()
        reached = [(sent.method, sent.path_qs) for sent in stack.hop.sent[seen:]]
        assert reached == [(method, path) for path in STATUS_READS for method in ("GET", "HEAD")]
        assert await scrape() == first


async def test_a_post_to_a_status_path_is_counted(stack: Stack) -> None:
    url = stack.sidecar.url
    async with aiohttp.ClientSession() as session:

        async def passthrough_count() -> float:
            async with session.get(url + "/toolpair/metrics") as response:
                text = await response.text()
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith('toolpair_requests_total{route="passthrough"')
            )

        before = await passthrough_count()
        async with session.post(url + "/props", data=b"{}") as response:
            await response.read()  # llama-server answers it (or refuses it): either way it was a request
        assert await passthrough_count() == before + 1
