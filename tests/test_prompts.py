"""radixgen.prompts: the prompt checks every entry point shares."""

from __future__ import annotations

import pytest

from radixgen.prompts import check_token_ids, prompt_ids


class CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return ([0] if add_special_tokens else []) + [ord(c) for c in text]


def test_text_and_ids() -> None:
    tok = CharTokenizer()
    assert prompt_ids("ab", tok, 8) == [0, 97, 98]
    assert prompt_ids("ab", tok, 8, add_special_tokens=False) == [97, 98]
    ids = [1, 2, 3]
    got = prompt_ids(ids, tok, 8, vocab_size=10)
    assert got == ids and got is not ids  # copied


@pytest.mark.parametrize(
    "prompt, kwargs, message",
    [
        ("", {}, "prompt: must not be empty"),
        ([], {}, "prompt: must not be empty"),
        ("", {"param": "messages"}, "messages: must not be empty"),
        ("x" * 8, {}, "prompt: 9 tokens is longer than the context allows (8 tokens)"),
        ([1, 99], {"vocab_size": 10}, "input_ids: token id 99 is outside the vocabulary [0, 10)"),
        ([1, 99], {}, None),  # no vocab_size: the caller checks ids later
        (3.5, {}, "prompt: expected a string or a list of token ids, got float"),
        (["a"], {}, "prompt: expected a string or a list of token ids, got list"),
    ],
)
def test_bad_prompts_raise_naming_the_field(prompt, kwargs, message) -> None:
    if message is None:
        assert prompt_ids(prompt, CharTokenizer(), 8, **kwargs) == prompt
        return
    with pytest.raises(ValueError) as err:
        prompt_ids(prompt, CharTokenizer(), 8, **kwargs)
    assert str(err.value) == message


def test_check_token_ids_names_its_param() -> None:
    check_token_ids([0, 9], 10)
    with pytest.raises(
        ValueError, match=r"^score: token id -1 is outside the vocabulary \[0, 10\)$"
    ):
        check_token_ids([-1], 10, param="score")


def test_a_lone_surrogate_is_a_value_error_naming_the_field() -> None:
    """JSON can carry "\\ud800"; no tokenizer can encode it (it used to be a 500)."""
    with pytest.raises(
        ValueError, match=r"messages: not valid Unicode text \(a lone surrogate at character 1\)"
    ):
        prompt_ids("a\ud800b", CharTokenizer(), 100, param="messages")
