"""Multi-LoRA over HTTP with the openai SDK unmodified: an adapter picked by ``model`` (its name,
or ``BASE:ADAPTER``) or by ``lora_path``, listed by ``/v1/models``, loaded and unloaded at run
time by ``/load_lora_adapter`` and ``/unload_lora_adapter``; a bad adapter is a 400 naming the
field and the server serves on."""

from __future__ import annotations

import httpx
import pytest
from lora_adapters import tiny_adapters
from tiny_server import TinyServer

openai = pytest.importorskip("openai")
pytest.importorskip("peft")

MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def adapters(tiny_model_folder, tmp_path_factory):
    return tiny_adapters(tiny_model_folder, tmp_path_factory.mktemp("loras"))


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_folder, adapters):
    log = tmp_path_factory.mktemp("lora-log") / "server.log"
    srv = TinyServer(
        tiny_model_folder, log, "--num-threads", "1", "--lora-paths", f"a={adapters['a']}"
    )
    yield srv
    srv.stop()
    assert "Traceback" not in srv.text(), srv.text()


def chat(client, **fields):
    return client.chat.completions.create(
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True, **fields.pop("extra", {})},
        **fields,
    )


def test_model_or_lora_path_picks_the_adapter(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    by_name = chat(client, model="a")
    by_base = chat(client, model=f"{server.model}:a")
    by_field = chat(client, model=server.model, extra={"lora_path": "a"})
    base = chat(client, model=server.model)
    assert by_name.model == "a" and by_base.model == f"{server.model}:a" and base.model != "a"
    texts = {r.choices[0].message.content for r in (by_name, by_base, by_field)}
    assert len(texts) == 1 and base.choices[0].message.content not in texts
    native = httpx.post(
        f"{server.url}/generate",
        json={
            "text": ["hi", "hi"],
            "lora_path": ["a", None],
            "sampling_params": {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True},
        },
        timeout=60,
    ).json()
    assert native[0]["text"] != native[1]["text"]


def test_models_lists_the_adapters(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    cards = {m.id: m for m in client.models.list().data}
    served = next(iter(cards))  # the base model's card comes first
    assert cards["a"].parent == served and cards["a"].root.endswith("/a")
    assert client.models.retrieve("a").id == "a"


def test_adapters_load_and_unload_at_run_time(server, adapters):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    r = httpx.post(
        f"{server.url}/load_lora_adapter",
        json={"lora_name": "b", "lora_path": str(adapters["b"])},
        timeout=60,
    )
    assert r.status_code == 200 and r.json()["loaded_adapters"].keys() == {"a", "b"}
    on_b = chat(client, model="b")
    assert on_b.model == "b"
    assert (
        on_b.choices[0].message.content
        != chat(client, model=server.model).choices[0].message.content
    )
    r = httpx.post(f"{server.url}/unload_lora_adapter", json={"lora_name": "b"}, timeout=60)
    assert r.status_code == 200 and set(r.json()["loaded_adapters"]) == {"a"}
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, model=server.model, extra={"lora_path": "b"})
    assert (
        err.value.body["param"] == "lora_path"
        and "no adapter named 'b'" in err.value.body["message"]
    )
    with pytest.raises(openai.BadRequestError) as err:
        chat(client, model=f"{server.model}:b")
    assert err.value.body["param"] == "model"


def test_bad_adapters_are_a_400_and_the_server_serves_on(server, tmp_path):
    bad = [
        ({"lora_name": "x", "lora_path": "/nowhere"}, "lora_path", "is not a folder"),
        ({"lora_name": "a", "lora_path": "/nowhere"}, "lora_path", "is not a folder"),
        ({"lora_name": "x", "lora_path": str(tmp_path)}, "lora_path", "no adapter_config.json"),
        ({"lora_name": "x", "lora_path": "/tmp", "load_inplace": True}, "load_inplace", "unload"),
    ]
    for body, param, words in bad:
        r = httpx.post(f"{server.url}/load_lora_adapter", json=body, timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and words in error["message"], error
    r = httpx.post(f"{server.url}/unload_lora_adapter", json={"lora_name": "zzz"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "lora_name"
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x")
    assert chat(client, model="a").choices[0].message.content
