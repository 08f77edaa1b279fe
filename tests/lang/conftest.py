"""Backends for the DSL tests: the session ``engine`` in process, and a live ``radixgen serve``.

The server (default model, 127.0.0.1, a free port) starts on first use and is shared by the
``/generate`` (``RuntimeEndpoint``) and ``/v1`` (``OpenAI``) tests; its log is printed if it
fails to start. If ``radixgen.server`` cannot be imported, those tests are skipped.
Keep max tokens small: the CI machine has two shared CPU cores.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lang_testlib import server_available

STARTUP_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    import httpx

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
def lang_server_url(tmp_path_factory: pytest.TempPathFactory):
    reason = server_available()
    if reason:
        pytest.skip(reason)
    port = _free_port()
    log = tmp_path_factory.mktemp("lang_server") / "server.log"
    cmd = [sys.executable, "-m", "radixgen", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--max-total-tokens", "16384"]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def local_backend(engine):
    from radixgen.lang import LocalBackend

    return LocalBackend(engine)


@pytest.fixture(scope="session")
def http_backend(lang_server_url):
    from radixgen.lang import RuntimeEndpoint

    backend = RuntimeEndpoint(lang_server_url)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def openai_backend(lang_server_url):
    from radixgen.lang import OpenAI

    return OpenAI(base_url=f"{lang_server_url}/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(params=["local", "http"])
def backend(request):
    """Each program test runs in process and against ``radixgen serve``'s ``/generate``."""
    return request.getfixturevalue(f"{request.param}_backend")
