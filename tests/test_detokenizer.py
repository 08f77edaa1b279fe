"""Incremental detokenization never splits a character; stop strings cut exactly."""

from __future__ import annotations

import pytest

from radixgen.detokenizer import IncrementalDetokenizer, StopStringMatcher

TEXTS = ["Emoji 🚀🎉👩‍💻 and 中文字符 mixed with ascii", "ñandú café 🇫🇷", "plain ascii text only"]


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_join_without_replacement_chars(tokenizer, text):
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push([t]) for t in tokenizer.encode(text)]
    deltas.append(detok.flush())
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)


def test_split_character_is_held_back(tokenizer):
    ids = tokenizer.encode("🚀")
    assert len(ids) > 1  # byte-level BPE splits this emoji
    detok = IncrementalDetokenizer(tokenizer)
    assert [detok.push([t]) for t in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.push(ids[-1:]) == "🚀"


def test_an_output_ending_inside_a_character_ends_with_a_replacement(tokenizer):
    """max_tokens reached inside a character: its bytes never complete; the text ends with
    U+FFFD, the tokenizer's decode of the tokens, rather than silently losing them."""
    ids = tokenizer.encode("go 🚀")
    detok = IncrementalDetokenizer(tokenizer)
    text = "".join(detok.push([t]) for t in ids[:-1])
    text += detok.flush()
    assert text == "go \ufffd" == tokenizer.decode(ids[:-1])


@pytest.mark.parametrize(
    ("stops", "text", "expected"),
    [
        (["END"], "abc END def", 4),
        (["x", "bc"], "abcx", 1),
        (["zz"], "abc", None),
        (["\n\n"], "a\n\nb", 1),
    ],
)
def test_stop_string_found(stops, text, expected):
    assert StopStringMatcher(stops).find(text) == expected


@pytest.mark.parametrize(
    ("stops", "text", "safe"),
    [
        (["END"], "abc E", 4),
        (["END"], "abc EN", 4),
        (["END"], "abc X", 5),
        (["</a>", "<b"], "x <", 2),
        ([], "x<", 2),
    ],
)
def test_streaming_holds_back_possible_stop_prefix(stops, text, safe):
    assert StopStringMatcher(stops).safe_len(text) == safe


def test_incremental_find_spans_chunks():
    matcher = StopStringMatcher(["STOP"])
    assert matcher.find("abc ST") is None
    assert matcher.find("abc STOP") == 4
