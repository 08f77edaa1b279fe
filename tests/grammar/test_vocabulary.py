"""Vocabulary: raw token bytes for byte-level BPE and SentencePiece, exclusions, fingerprint."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from radixgen.grammar.tokens.vocabulary import (
    Vocabulary,
    byte_level_token_bytes,
    detect_kind,
    sentencepiece_token_bytes,
)
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers


@pytest.fixture(scope="module")
def vocab(tokenizer) -> Vocabulary:
    return Vocabulary.from_tokenizer(tokenizer)


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("Ġhello", b" hello"),
        ("Ċ", b"\n"),
        ("ĉ", b"\t"),
        ("Ã©", "é".encode()),
        ("Ã", b"\xc3"),
        ('{"', b'{"'),
        ("<|x|>", b"<|x|>"),
    ],
)
def test_byte_level_token_bytes(token: str, expected: bytes) -> None:
    assert byte_level_token_bytes(token) == expected


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("▁hello", b" hello"),
        ("<0x0A>", b"\n"),
        ("<0xE9>", b"\xe9"),
        ("é", "é".encode()),
        ("a▁b", b"a b"),
        ("<0x0>", b"<0x0>"),
    ],
)
def test_sentencepiece_token_bytes(token: str, expected: bytes) -> None:
    assert sentencepiece_token_bytes(token) == expected


def test_default_model_vocabulary(tokenizer, vocab: Vocabulary) -> None:
    assert vocab.kind == "byte_level"
    assert vocab.vocab_size == tokenizer.vocab_size == 49152
    assert vocab.eos_token_ids == tuple(tokenizer.eos_token_ids)
    assert all(
        vocab.token_bytes[i] is None for i in tokenizer.special_ids | set(tokenizer.eos_token_ids)
    )
    assert vocab.num_words == 1536
    for text in ['{"name": "Jo"}', "héllo wörld", "\n\t  x", "😀 ok"]:
        assert b"".join(vocab.token_bytes[i] for i in tokenizer.encode(text)) == text.encode()


def test_bytes_match_decode(tokenizer, vocab: Vocabulary) -> None:
    checked = 0
    for token_id in range(0, vocab.vocab_size, 7):
        data = vocab.token_bytes[token_id]
        if data is None:
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            continue  # a fragment of a multi-byte character
        assert tokenizer.decode([token_id]) == text
        checked += 1
    assert checked > 6000


def test_fingerprint_is_stable_and_content_based(tokenizer, vocab: Vocabulary) -> None:
    assert Vocabulary.from_tokenizer(tokenizer).fingerprint == vocab.fingerprint
    changed = list(vocab.token_bytes)
    changed[100] = b"changed"
    assert (
        Vocabulary.from_token_bytes(changed, list(vocab.eos_token_ids)).fingerprint
        != vocab.fingerprint
    )
    other_eos = Vocabulary.from_token_bytes(list(vocab.token_bytes), [3])
    assert other_eos.fingerprint != vocab.fingerprint


def test_from_token_bytes_excludes_eos_and_empty() -> None:
    vocab = Vocabulary.from_token_bytes([b"a", b"", b"</s>", b"bc"], [2])
    assert vocab.token_bytes == (b"a", None, None, b"bc")
    assert vocab.max_token_len == 2 and vocab.num_words == 1


def _sentencepiece_tokenizer() -> SimpleNamespace:
    tokens = [
        "<unk>",
        "<s>",
        "</s>",
        "<0x0A>",
        "<0xC3>",
        "<0xA9>",
        "▁",
        "a",
        "b",
        "▁a",
        "ab",
        "▁ab",
    ]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [("▁", "a"), ("a", "b"), ("▁a", "b")]
    backend = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    backend.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    backend.add_special_tokens([AddedToken(t, special=True) for t in tokens[:3]])
    backend.add_tokens([AddedToken("<tool>", special=False)])
    return SimpleNamespace(
        backend=backend,
        special_ids={0, 1, 2},
        eos_token_ids=[2],
        vocab_size=backend.get_vocab_size(with_added_tokens=True),
    )


def test_sentencepiece_vocabulary() -> None:
    tok = _sentencepiece_tokenizer()
    assert detect_kind(tok.backend) == "sentencepiece"
    vocab = Vocabulary.from_tokenizer(tok)
    assert vocab.kind == "sentencepiece"
    assert vocab.token_bytes[:3] == (None, None, None)
    assert vocab.token_bytes[3:] == (
        b"\n",
        b"\xc3",
        b"\xa9",
        b" ",
        b"a",
        b"b",
        b" a",
        b"ab",
        b" ab",
        b"<tool>",
    )
