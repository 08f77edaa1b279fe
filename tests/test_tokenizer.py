"""The GGUF-rebuilt tokenizer and chat template match transformers' GGUF tokenizer."""

from __future__ import annotations

import json

import pytest

from radixgen.tokenizer import tokenizer_from_hf_folder

MIXED = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "你好，世界！今天天气很好。机器学习是人工智能的一个分支。",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "Emoji: 🚀🎉👩‍💻 flags 🇫🇷 and ñ, é, ß, Ω",
    "whitespace   runs\t\t tabs \n\n\n newlines      and trailing   ",
    "numbers 1234567890 3.14159 -42 1e10",
    '{"key": [1, 2, {"nested": null}], "t": true}',
    "<|im_start|>user\nspecial tokens inline<|im_end|>",
]

MESSAGES = [
    [{"role": "user", "content": "hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "and 3+3?"},
    ],
]


@pytest.mark.parametrize("text", MIXED)
def test_encode_matches_transformers(tokenizer, hf_gguf_tokenizer, text):
    assert tokenizer.encode(text) == hf_gguf_tokenizer.encode(text, add_special_tokens=False)


def test_mixed_text_roundtrip(tokenizer):
    text = "".join(MIXED[:-1])
    assert tokenizer.decode(tokenizer.encode(text)) == text


@pytest.mark.parametrize("messages", MESSAGES)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(
    tokenizer, hf_gguf_tokenizer, messages, add_generation_prompt
):
    ours = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    ref = hf_gguf_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours == ref


def test_special_ids_and_eos(tokenizer):
    assert tokenizer.eos_token_id == 2 and tokenizer.eos_token_ids == [2]
    assert tokenizer.special_ids == set(range(17))
    assert tokenizer.decode(tokenizer.encode("<|im_end|>")) == ""
    assert (
        tokenizer.decode(tokenizer.encode("<|im_end|>"), skip_special_tokens=False) == "<|im_end|>"
    )


def test_raise_exception_in_template(tokenizer):
    from radixgen.tokenizer import Tokenizer

    tok = Tokenizer(
        tokenizer.backend,
        chat_template="{{ raise_exception('roles must alternate') }}",
        bos_token=None,
        eos_token="<|im_end|>",
    )
    with pytest.raises(ValueError, match="chat template: roles must alternate"):
        tok.apply_chat_template([{"role": "user", "content": "x"}])


def test_tools_reach_the_template(tokenizer):
    from radixgen.tokenizer import Tokenizer

    tok = Tokenizer(
        tokenizer.backend,
        chat_template="{% for t in tools %}{{ t.function.name }};{% endfor %}",
        bos_token=None,
        eos_token=None,
    )
    tools = [{"type": "function", "function": {"name": "get_weather"}}]
    assert (
        tok.apply_chat_template([{"role": "user", "content": "x"}], tools=tools) == "get_weather;"
    )


def test_empty_messages_rejected(tokenizer):
    with pytest.raises(ValueError, match="messages"):
        tokenizer.apply_chat_template([])


def test_hf_folder_tokenizer(tokenizer, tmp_path):
    tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": tokenizer.chat_template,
                "eos_token": "<|im_end|>",
                "bos_token": "<|im_start|>",
            }
        )
    )
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    folder_tok = tokenizer_from_hf_folder(tmp_path)
    assert folder_tok.encode(MIXED[1]) == tokenizer.encode(MIXED[1])
    assert folder_tok.eos_token_ids == [2, 0]
    assert folder_tok.apply_chat_template(MESSAGES[1]) == tokenizer.apply_chat_template(MESSAGES[1])
