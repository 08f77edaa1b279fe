"""Helpers for tests that start live servers (``radixgen serve``, ``radixgen router``): the
test API key and body limit, a free port, waiting for ``/health``. Test modules import them from
here (``conftest`` is not importable by name from every folder)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest

SERVER_API_KEY = "test-key"
SERVER_BODY_LIMIT = 262_144  # --max-body-bytes of the test server
SERVER_STARTUP_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, log: Path) -> None:
    import httpx

    deadline = time.monotonic() + SERVER_STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"radixgen serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(
        f"radixgen serve not healthy after {SERVER_STARTUP_TIMEOUT_S}s:\n{log.read_text()[-4000:]}"
    )
