"""SGLang's own frontend (``sglang.lang``) against the live server, unmodified (issue #17 item 5).

Skipped where sglang is not importable. sglang's own pins (torch, transformers, xgrammar, openai
...) would replace dev's, so .ci/run installs it with ``pip install --no-deps sglang==0.5.23``;
what ``sglang.lang`` imports at run time (pybase64, msgspec, pyzmq, IPython; aiohttp comes with
litellm) is in pyproject's ``clients`` extra.
"""

from __future__ import annotations

import json

import pytest
from server_testlib import API_KEY

sgl = pytest.importorskip("sglang", reason="SGLang's frontend is not installed")

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


@pytest.fixture(scope="module")
def backend(server_url):
    endpoint = sgl.RuntimeEndpoint(server_url, api_key=API_KEY)  # reads /get_model_info
    sgl.set_default_backend(endpoint)
    return endpoint


@sgl.function
def _qa(s, question):
    s += sgl.system("You are terse.")
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("answer", max_tokens=12, temperature=0, stop=["\n"]))


@sgl.function
def _structured(s):
    s += "Give a number: " + sgl.gen("num", max_tokens=8, regex=r"[0-9]{1,3}", temperature=0)
    s += "\nJSON: " + sgl.gen("obj", max_tokens=48, temperature=0, json_schema=json.dumps(SCHEMA))
    s += "\nIs the sky blue? " + sgl.select("yes_no", choices=["yes", "no"])


@sgl.function
def _forked(s):
    s += "List two fruits:\n"
    forks = s.fork(2)
    for i, f in enumerate(forks):
        f += f"{i + 1}. " + sgl.gen("fruit", max_tokens=6, temperature=0, stop="\n")
    s += "Done: " + forks[0]["fruit"] + ", " + forks[1]["fruit"]


def test_server_info(backend):
    assert sgl.get_server_info(backend)["max_total_num_tokens"] > 0  # GET /server_info


def test_roles_and_gen_with_stop(backend):
    state = _qa.run(question="Capital of France?")
    assert state["answer"] and "\n" not in state["answer"]


def test_regex_json_schema_and_select(backend):
    state = _structured.run()
    assert state["num"].isdigit()
    assert isinstance(json.loads(state["obj"])["a"], int)
    assert state["yes_no"] in ("yes", "no")


def test_fork_run_batch_and_stream(backend):
    assert _forked.run().text().startswith("List two fruits:\nDone: ")
    states = _qa.run_batch([{"question": "2+2?"}, {"question": "Color of grass?"}])
    assert all(s["answer"] for s in states)
    streamed = "".join(_qa.run(question="Say hi.", stream=True).text_iter())
    assert streamed.endswith(_qa.run(question="Say hi.")["answer"] + "\n")


def _annotated_fields(module: str, cls: str) -> list[str]:
    """The fields ``cls`` declares in sglang's source (read, not imported: io_struct pulls in
    the whole runtime)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin
    with open(spec.origin) as source:
        tree = ast.parse(source.read())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    return [n.target.id for n in node.body if isinstance(n, ast.AnnAssign)]


# SamplingParams fields that sglang fills itself (``normalize``), never sent by a client
SGLANG_INTERNAL = {
    "stop_strs",
    "stop_regex_strs",
    "stop_str_max_len",
    "stop_regex_max_len",
    "is_normalized",
    "ebnf_full_assistant",
}


def test_every_field_of_the_installed_sglang_is_classified():
    from radixgen import SamplingParams
    from radixgen.server import sglang_fields as f

    body = _annotated_fields("sglang.srt.managers.io_struct", "GenerateReqInput")
    known = {*f.BODY_HONORED, *f.BODY_EXTRA_HONORED, *f.BODY_IGNORED, *f.BODY_REFUSED}
    assert [name for name in body if name not in known] == []
    sampling = _annotated_fields("sglang.srt.sampling.sampling_params", "SamplingParams")
    known = {
        *SamplingParams.field_names(),
        *f.SAMPLING_RENAMED,
        *f.SAMPLING_NATIVE,
        *f.SAMPLING_IGNORED,
        *f.SAMPLING_REFUSED,
        *SGLANG_INTERNAL,
    }
    assert [name for name in sampling if name not in known] == []
