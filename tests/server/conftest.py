"""Clients of the live ``radixgen serve`` (fixture ``server_url`` in tests/conftest.py).

The server runs the default model (SmolLM2-135M-Instruct) on 127.0.0.1 at a free port with
``--api-key test-key`` and a small body limit; tests talk to it with the real ``openai``
client and ``httpx``. Its log goes to ``<tmp>/server.log`` (printed if start-up fails).
Keep ``max_tokens`` small: the CI machine has two shared CPU cores.
"""

from __future__ import annotations

import httpx
import pytest
from server_testlib import API_KEY


@pytest.fixture(scope="session")
def client(server_url: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{server_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(server_url: str):
    with httpx.Client(
        base_url=server_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    ) as c:
        yield c
