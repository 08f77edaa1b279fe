"""The tokenizer's vocabulary as raw bytes: what each token id writes into the output.

Grammars constrain bytes, so every token is reduced to the exact bytes it appends:

- byte-level BPE (GPT-2, Llama 3, SmolLM, Qwen): token strings are spelled with GPT-2's
  ``bytes_to_unicode`` alphabet; each character maps back to one byte.
- SentencePiece BPE (Llama 2, Mistral): ``▁`` is a space and ``<0xNN>`` is the byte NN
  (byte fallback); other characters are UTF-8.

Special (control) tokens are excluded: a grammar never allows them. EOS ids are kept apart
(allowed only where the grammar can end). ``fingerprint`` identifies the contents for caches.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

VocabKind = Literal["byte_level", "sentencepiece"]
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@functools.lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's reversible byte -> printable character map."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


def byte_level_token_bytes(token: str) -> bytes:
    """Bytes of a byte-level BPE token (characters outside the alphabet are taken as UTF-8)."""
    table = _unicode_to_byte()
    if all(ch in table for ch in token):
        return bytes(table[ch] for ch in token)
    return token.encode("utf-8")


def sentencepiece_token_bytes(token: str) -> bytes:
    """Bytes of a SentencePiece token: ``▁`` -> space, ``<0xNN>`` -> byte NN."""
    match = _BYTE_TOKEN.fullmatch(token)
    if match:
        return bytes([int(match.group(1), 16)])
    return token.replace("▁", " ").encode("utf-8")


@dataclass(frozen=True, eq=False)
class Vocabulary:
    """Raw bytes per token id (``None`` for special, EOS and unused ids).

    Immutable and shared by every grammar compiled for this tokenizer. ``vocab_size`` is the
    number of ids the bitmask covers (``ceil(vocab_size / 32)`` int32 words per row).
    """

    token_bytes: tuple[bytes | None, ...]
    eos_token_ids: tuple[int, ...]
    kind: VocabKind = "byte_level"
    fingerprint: str = field(init=False)
    max_token_len: int = field(init=False)
    _lock: threading.Lock = field(init=False, repr=False, compare=False)
    _cache: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fingerprint", self._digest())
        object.__setattr__(
            self, "max_token_len", max((len(b) for b in self.token_bytes if b), default=1)
        )
        object.__setattr__(self, "_lock", threading.Lock())
        object.__setattr__(self, "_cache", {})

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its bytes (a worker process rebuilds the rest)."""
        return (type(self), (self.token_bytes, self.eos_token_ids, self.kind))

    @property
    def vocab_size(self) -> int:
        return len(self.token_bytes)

    @property
    def num_words(self) -> int:
        """int32 words per bitmask row."""
        return (self.vocab_size + 31) // 32

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> Vocabulary:
        """Build from a radixgen ``Tokenizer`` (``backend`` a ``tokenizers.Tokenizer``)."""
        backend = tokenizer.backend
        kind = detect_kind(backend)
        to_bytes = byte_level_token_bytes if kind == "byte_level" else sentencepiece_token_bytes
        excluded = set(tokenizer.special_ids) | set(tokenizer.eos_token_ids)
        added = backend.get_added_tokens_decoder()
        token_bytes: list[bytes | None] = []
        for token_id in range(tokenizer.vocab_size):
            text = backend.id_to_token(token_id)
            if token_id in excluded or text is None:
                token_bytes.append(None)
            elif token_id in added:  # added tokens are stored as plain text
                token_bytes.append(added[token_id].content.encode("utf-8") or None)
            else:
                token_bytes.append(to_bytes(text) or None)
        return cls(tuple(token_bytes), tuple(tokenizer.eos_token_ids), kind)

    @classmethod
    def from_token_bytes(
        cls,
        token_bytes: list[bytes | None],
        eos_token_ids: list[int],
        kind: VocabKind = "byte_level",
    ) -> Vocabulary:
        """Build from explicit bytes per id (tests, other tokenizer libraries)."""
        eos = set(eos_token_ids)
        cleaned = tuple(None if i in eos or not b else bytes(b) for i, b in enumerate(token_bytes))
        return cls(cleaned, tuple(eos_token_ids), kind)

    def cached(self, name: str, build: Any) -> Any:
        """A derived structure built once per vocabulary (thread-safe); ``build(self)`` makes it."""
        with self._lock:
            if name not in self._cache:
                self._cache[name] = build(self)
            return self._cache[name]

    def _digest(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps([self.kind, len(self.token_bytes), list(self.eos_token_ids)]).encode())
        for token in self.token_bytes:
            if token is None:
                h.update(b"\xff\xff\xff\xff")
            else:
                h.update(len(token).to_bytes(4, "little"))
                h.update(token)
        return h.hexdigest()


def detect_kind(backend: Any) -> VocabKind:
    """Byte-level BPE or SentencePiece, from the decoder (falling back to the vocabulary)."""
    decoder = backend.decoder
    state = decoder.__getstate__() if decoder is not None else b""
    state = state.decode() if isinstance(state, bytes) else str(state)
    if '"ByteLevel"' in state:
        return "byte_level"
    if "ByteFallback" in state or "▁" in state or "Metaspace" in state:
        return "sentencepiece"
    vocab = backend.get_vocab(with_added_tokens=False)
    if sum("▁" in t for t in vocab) > sum("Ġ" in t for t in vocab):
        return "sentencepiece"
    return "byte_level"
