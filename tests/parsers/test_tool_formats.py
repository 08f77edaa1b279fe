"""Each tool-call format against its family's real chat template (tests/families.py).

A call the template writes into an assistant turn is what the model was trained to write: the
parser reads it back, whole or streamed one character at a time, and what a grammar holds in
that format (``strict_auto_tag``) is read back the same way. Text that is no call stays content.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from families import FAMILIES, family_tokenizer  # noqa: E402

from radixgen.parsers import tools as tool_formats  # noqa: E402
from radixgen.parsers.choice import choose  # noqa: E402
from radixgen.parsers.tools import CallParser, parse_calls  # noqa: E402
from radixgen.server.protocol import Tool  # noqa: E402
from radixgen.server.tools import strict_auto_tag  # noqa: E402

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
ZONE = {
    "type": "object",
    "properties": {"zone": {"type": "string"}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOL_DICTS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": ZONE}},
]  # fmt: skip
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOL_DICTS}
CALLS = [("get_weather", {"city": "Paris"}), ("get_time", {"zone": "UTC"})]
# the formats in which one assistant turn holds several calls (Llama 3.1's template refuses)
PARALLEL = {"qwen3", "qwen3-coder", "mistral-v3", "mistral-v11", "deepseek-v3.1", "deepseek-r1"}


@pytest.fixture(scope="module")
def tokenizers(tokenizer):
    return {name: family_tokenizer(tokenizer, family) for name, family in FAMILIES.items()}


def _formats(tokenizers, name):
    return choose("auto", "auto", tokenizers[name])


def _assistant_text(tokenizers, name: str, calls) -> str:
    """What the family's template writes for an assistant turn of ``calls`` (the model's
    output: from the generation prompt to the end-of-turn token)."""
    tok, family = tokenizers[name], FAMILIES[name]
    user = [{"role": "user", "content": "Weather in Paris, and the time?"}]
    kwargs = {"tools": TOOL_DICTS}
    prefix = tok.apply_chat_template(user, add_generation_prompt=True, **kwargs)
    formats = _formats(tokenizers, name)
    tool_calls = [
        {"id": f"abcdefgh{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(calls)
    ]
    message = {"role": "assistant", "content": "", "tool_calls": tool_calls}
    from radixgen.server.tools import ChatRenderer

    if not ChatRenderer(tok, formats).renders_calls:  # LFM2: calls are written in the content
        message = {"role": "assistant", "content": formats.tools.render_calls(calls)}
    full = tok.apply_chat_template([*user, message], add_generation_prompt=False, **kwargs)
    # DeepSeek's templates close the turn differently with and without the generation prompt
    common = next(i for i, (a, b) in enumerate(zip(prefix + "\0", full)) if a != b)
    if full.startswith(prefix):
        tail = full[len(prefix) :]
    else:  # the turn starts after the last assistant tag both share
        tag = "<｜Assistant｜>"
        tail = full[full.rindex(tag, 0, common + len(tag)) + len(tag) :]
    for end in family.ends:
        if end in tail:
            tail = tail[: tail.index(end)]
    return tail.removeprefix("<think>\n\n</think>\n\n")


@pytest.mark.parametrize("name", list(FAMILIES))
def test_the_template_picks_the_family_format(tokenizers, name):
    formats = _formats(tokenizers, name)
    assert formats.tools.name == FAMILIES[name].tool_format
    assert (formats.reasoning.name if formats.reasoning else None) == FAMILIES[name].reasoning
    assert formats.notes  # the start-up log says what was picked


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("parallel", [False, True])
def test_calls_the_template_writes_parse_back(tokenizers, name, parallel):
    if parallel and name not in PARALLEL:
        pytest.skip("the template writes one call per turn")
    calls = CALLS if parallel else CALLS[:1]
    fmt = _formats(tokenizers, name).tools
    text = _assistant_text(tokenizers, name, calls)
    content, parsed = parse_calls(fmt, SCHEMAS, text)
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls, text
    assert content is None, (text, content)


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("stream", [False, True])
def test_streamed_one_character_at_a_time_equals_whole(tokenizers, name, stream):
    calls = CALLS if name in PARALLEL else CALLS[:1]
    fmt = _formats(tokenizers, name).tools
    text = "Let me check. " + _assistant_text(tokenizers, name, calls)
    if fmt.bare_start is not None and name != "lfm2":
        text = text.removeprefix("Let me check. ")  # bare calls are the whole output
    parser = CallParser(fmt, SCHEMAS, stream=stream)
    events = [e for ch in text for e in parser.feed(ch)] + parser.finish()
    names, args, content = [], [], ""
    for kind, value in events:
        if kind in ("call", "call_start"):
            names.append(value.name)
            args.append(value.arguments)
        elif kind == "args":
            args[-1] += value
        else:
            content += value
    assert names == [n for n, _ in calls]
    assert [json.loads(a) for a in args] == [a for _, a in calls]
    assert content.strip() in ("", "Let me check.")
    for marker in fmt.openers:
        assert marker not in content


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_call_that_does_not_parse_is_content(tokenizers, name):
    fmt = _formats(tokenizers, name).tools
    text = _assistant_text(tokenizers, name, CALLS[:1]).replace("get_weather", "get_wether")
    content, parsed = parse_calls(fmt, SCHEMAS, text)
    assert parsed == [] and content, text
    broken = _assistant_text(tokenizers, name, CALLS[:1])[:-4]
    assert parse_calls(fmt, SCHEMAS, broken) is not None  # cut short: never raises


def _accepts(tag: dict, text: str) -> bool:
    from radixgen.grammar import GrammarCompiler
    from radixgen.grammar.tokens.vocabulary import Vocabulary

    tokens = [None, *(bytes((b,)) for b in range(256))]  # id 0: EOS, then every byte
    compiler = GrammarCompiler(Vocabulary.from_token_bytes(tokens, [0]), precompute_s=0.0)
    try:
        matcher = compiler.compile_structural_tag(tag, strict=True).matcher()
        return matcher.accept_string(text) and matcher.is_accepting()
    finally:
        compiler.shutdown()


STRICT = [
    Tool.model_validate({**t, "function": {**t["function"], "strict": True}}) for t in TOOL_DICTS
]


def _held_call(fmt, name: str, arguments: dict) -> str:
    """A call as the grammar writes it: the format's tag around compact JSON arguments."""
    (tag,) = fmt.call_tags(name, SCHEMAS[name])
    body = json.dumps(arguments, separators=(",", ":"))
    if tag["content"]["type"] != "json_schema":  # Qwen3-Coder: XML parameters
        return fmt.render_calls([(name, arguments)])
    return tag["begin"] + body + tag["end"]


@pytest.mark.parametrize("name", [n for n in FAMILIES if n != "lfm2"])
def test_strict_calls_are_held_in_the_family_format_and_read_back(tokenizers, name):
    fmt = _formats(tokenizers, name).tools
    tag = strict_auto_tag(STRICT, None, fmt=fmt)
    call = _held_call(fmt, "get_weather", {"city": "Paris"})
    assert _accepts(tag, "Let me look. " + call), call
    assert not _accepts(tag, "Let me look. " + call.replace("city", "town"))
    assert not _accepts(tag, call.replace("get_weather", "get_wether"))
    _, parsed = parse_calls(fmt, SCHEMAS, call, bare=False)
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_pythonic_strict_tools_are_refused_with_the_reason(tokenizers):
    fmt = _formats(tokenizers, "lfm2").tools
    with pytest.raises(ValueError, match="tools: strict tools cannot be held in pythonic"):
        strict_auto_tag(STRICT, None, fmt=fmt)


def test_an_unknown_parser_name_lists_the_known_ones():
    with pytest.raises(ValueError, match="known: deepseek, hermes, llama3, mistral"):
        tool_formats.get("gorilla")


def test_a_template_of_an_unknown_format_gets_a_clear_note(tokenizer):
    """A template that renders tools in a format radixgen does not know: Hermes calls in
    radixgen's own prompt, and the start-up note says so (never silently)."""
    from radixgen.tokenizer import Tokenizer

    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if tools %}TOOLS: {{ tools | tojson }}{% endif %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = Tokenizer(
        tokenizer.backend, chat_template=template, bos_token=None, eos_token="<|im_end|>"
    )
    formats = choose("auto", "auto", tok)
    assert formats.tools.name == "hermes" and not formats.native_tools
    assert "does not know" in formats.notes[-1]
