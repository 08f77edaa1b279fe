"""A live ``radixgen serve`` for the server tests (one per test session, shared by all modules).

The server runs the default model (SmolLM2-135M-Instruct) on 127.0.0.1 at a free port with
``--api-key test-key`` and a small body limit; tests talk to it with the real ``openai``
client and ``httpx``. Its log goes to ``<tmp>/server.log`` (printed if start-up fails).
Keep ``max_tokens`` small: the CI machine has two shared CPU cores.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from server_testlib import API_KEY, BODY_LIMIT

STARTUP_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"radixgen serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"radixgen serve not healthy after {STARTUP_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory):
    port = _free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    cmd = [sys.executable, "-m", "radixgen", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--api-key", API_KEY, "--max-body-bytes", str(BODY_LIMIT)]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)  # graceful shutdown within the grace period
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # uvicorn re-raises SIGTERM after a clean shutdown, so -SIGTERM is a normal exit too
    text = log.read_text()
    assert proc.returncode in (0, -signal.SIGTERM), f"radixgen serve exited with {proc.returncode}:\n{text[-4000:]}"
    assert "Application shutdown complete" in text and "Traceback" not in text, text[-4000:]


@pytest.fixture(scope="session")
def client(server_url: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(server_url: str):
    with httpx.Client(base_url=server_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as c:
        yield c
