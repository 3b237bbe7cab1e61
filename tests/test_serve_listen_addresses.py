"""``toolpair serve --host A,B`` listens on each address, as ``toolpair proxy`` and llama-server do."""

from __future__ import annotations

import signal
import urllib.request
from pathlib import Path

import pytest

from tests.support.network import has_ipv6_loopback
from tests.support.serve import start_serve


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback")
def test_serve_answers_on_each_address_it_was_given(tmp_path: Path) -> None:
    serving = start_serve(tmp_path, "--host", "127.0.0.1,::1", "--ctx-size", "1024")
    try:
        port = serving.url.rsplit(":", 1)[1]
        for address in ("127.0.0.1", "[::1]"):
            with urllib.request.urlopen(f"http://{address}:{port}/ready", timeout=10) as response:
                assert response.status == 200, address
        assert f"http://127.0.0.1:{port}" in serving.stdout.read_text()  # the banner names the first
    finally:
        serving.process.send_signal(signal.SIGTERM)
        serving.process.wait(60)
