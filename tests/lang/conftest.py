"""Backends for the DSL tests: the session ``engine`` in process, and a live ``radixgen serve``.

The server is the session's shared ``server_url`` (tests/conftest.py), used by the
``/generate`` (``RuntimeEndpoint``) and ``/v1`` (``OpenAI``) tests. If ``radixgen.server`` cannot be imported, those tests are skipped.
Keep max tokens small: the CI machine has two shared CPU cores.
"""

from __future__ import annotations

import pytest
from lang_testlib import server_available

API_KEY = "test-key"  # the shared server's --api-key (tests/conftest.py)


@pytest.fixture(scope="session")
def lang_server_url(server_url):
    reason = server_available()
    if reason:
        pytest.skip(reason)
    return server_url


@pytest.fixture(scope="session")
def local_backend(engine):
    from radixgen.lang import LocalBackend

    return LocalBackend(engine)


@pytest.fixture(scope="session")
def http_backend(lang_server_url):
    from radixgen.lang import RuntimeEndpoint

    backend = RuntimeEndpoint(lang_server_url, api_key=API_KEY)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def openai_backend(lang_server_url):
    from radixgen.lang import OpenAI

    return OpenAI(base_url=f"{lang_server_url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(params=["local", "http"])
def backend(request):
    """Each program test runs in process and against ``radixgen serve``'s ``/generate``."""
    return request.getfixturevalue(f"{request.param}_backend")
