"""``cache_salt``: a prefix-cache namespace. Two requests with different salts never share a
cached token; the same salt shares as before; unsalted requests share with each other only.
``cached_tokens`` reports it, on the engine and on every route (chat, completions, Responses,
``/generate``'s ``extra_key``, Anthropic's Messages)."""

from __future__ import annotations

import httpx
import pytest
from server_testlib import API_KEY

from radixgen import Engine, SamplingParams

AUTH = {"Authorization": f"Bearer {API_KEY}"}
# a prompt far longer than a chat template's own tokens: what is shared is the prompt
LONG = "The quick brown fox jumps over the lazy dog. " * 24


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_folder):
    eng = Engine(str(tiny_model_folder), max_total_tokens=8192)
    yield eng
    eng.shutdown()


def _cached(eng: Engine, prompt: str, salt: str | None) -> int:
    params = SamplingParams(max_new_tokens=2, temperature=0.0, cache_salt=salt)
    return eng.generate(prompt, params)[0].cached_tokens


def test_salts_isolate_and_the_same_salt_shares(tiny_engine):
    eng, prompt = tiny_engine, LONG + "engine"
    assert _cached(eng, prompt, "tenant-a") == 0
    assert _cached(eng, prompt, "tenant-a") > 100  # the same salt shares as before
    assert _cached(eng, prompt, "tenant-b") == 0  # another salt: not one token
    assert _cached(eng, prompt, None) == 0  # unsalted is a namespace of its own
    assert _cached(eng, prompt, None) > 100
    assert _cached(eng, prompt, "tenant-b") > 100
    eng.kv.cache.check_integrity()  # the namespaces' nodes keep the tree's invariants


def test_a_bad_salt_is_refused_naming_it(tiny_engine):
    for bad in ("", 7, "x" * 5000):
        with pytest.raises(ValueError, match="cache_salt"):
            tiny_engine.generate("hi", SamplingParams(max_new_tokens=1, cache_salt=bad))


def _chat(url: str, salt: str | None, text: str) -> int:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 2,
        "temperature": 0,
    }
    if salt is not None:
        body["cache_salt"] = salt
    r = httpx.post(f"{url}/v1/chat/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def test_chat_cache_salt(tiny_server_url):
    text = LONG + "chat, a prompt no other test sends"
    # unsalted: other tests on this shared server cached the template's opening tokens
    assert _chat(tiny_server_url, None, text) < 50
    assert _chat(tiny_server_url, "a", text) == 0
    assert _chat(tiny_server_url, "a", text) > 100
    assert _chat(tiny_server_url, None, text) > 100
    assert _chat(tiny_server_url, "b-chat-only", text) == 0
    assert _chat(tiny_server_url, "b-chat-only", text) > 100


def test_every_route_takes_the_salt(tiny_server_url):
    url, prompt = tiny_server_url, LONG + "routes"

    def completions(salt: str) -> int:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "cache_salt": salt}
        r = httpx.post(f"{url}/v1/completions", json=body, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    def generate(salt: str, name: str = "extra_key") -> int:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 2}, name: salt}
        r = httpx.post(f"{url}/generate", json=body, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["meta_info"]["cached_tokens"]

    def responses(salt: str) -> int:
        body = {"model": "tiny", "input": prompt, "max_output_tokens": 2, "cache_salt": salt}
        r = httpx.post(f"{url}/v1/responses", json=body, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["input_tokens_details"]["cached_tokens"]

    def messages(salt: str) -> int:
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 2,
            "cache_salt": salt,
        }
        r = httpx.post(f"{url}/v1/messages", json=body, headers=AUTH, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["cache_read_input_tokens"]

    for route in (completions, generate, responses, messages):
        salt = f"salt-{route.__name__}"
        assert route(salt) == 0, route.__name__
        assert route(salt) > 100, route.__name__
    # /generate: cache_salt is extra_key's other name (both given must agree)
    assert generate("salt-generate", "cache_salt") > 100
    body = {"text": prompt, "extra_key": "a", "cache_salt": "b"}
    r = httpx.post(f"{url}/generate", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "extra_key"


def test_a_bad_salt_is_a_400_naming_it(tiny_server_url):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "cache_salt": 5}
    r = httpx.post(f"{tiny_server_url}/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
