"""A ``radixgen serve`` process on a tiny random-weight model (the ``tiny_model_folder``
fixture), for tests that need their own server flags or that end the server (shutdown,
connection limits).

The model is a 2-layer Llama (hidden size 64) with the default model's tokenizer: it loads in
a few seconds and decodes a few hundred tokens a second on the CI machine, so a request with
``ignore_eos`` and a few thousand ``max_tokens`` is a stream that lasts as long as a test needs.
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

STARTUP_TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TinyServer:
    """``radixgen serve --model <tiny> <flags>`` on a free port; ``log`` holds its output."""

    def __init__(self, model: Path, log: Path, *flags: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model = model.name  # the served model name (the folder's name)
        self.log = log
        cmd = [sys.executable, "-m", "radixgen", "serve", "--model", str(model)]
        cmd += ["--port", str(self.port), "--max-total-tokens", "65536", *flags]
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"radixgen serve exited with {self.proc.returncode}:\n{self.text()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        pytest.fail(f"radixgen serve not healthy after {STARTUP_TIMEOUT_S} s:\n{self.text()}")

    def text(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def signal(self, sig: int = signal.SIGTERM) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        """The exit status, waiting up to ``timeout`` s (the process is killed after that)."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(
                f"radixgen serve still running {timeout} s after the signal:\n{self.text()}"
            )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def completion_body(model: str, max_tokens: int, **fields) -> dict:
    """A ``/v1/completions`` body that runs ``max_tokens`` decode steps (EOS ignored)."""
    return {
        "model": model,
        "prompt": "Once upon a time",
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        **fields,
    }
