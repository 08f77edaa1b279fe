"""What the client tests share: the live servers' key and model names, and one extraction task.

The servers are the session fixtures of tests/conftest.py: ``server_url`` (the default model,
for checks that need a real model's answer; such tests are marked slow), ``tiny_server_url``
(random weights served as ``tiny``: shape-only checks) and ``llguidance_server_url`` (the
default model with ``--grammar-backend llguidance``).
"""

from __future__ import annotations

from pydantic import BaseModel

API_KEY = "test-key"
MODEL = "smollm2-135m-instruct"
TINY = "tiny"
EXTRACT = "Extract the user: John Smith is 31 years old."


class User(BaseModel):
    """A default (non-strict) pydantic schema, as every structured-output client makes it."""

    name: str
    age: int


JOHN = User(name="John Smith", age=31)  # what the default model extracts from EXTRACT
