"""The model's tokenizer and chat template, from a GGUF file or a Hugging Face folder.

``load_tokenizer(model)`` takes the same model argument as ``Engine``. Encoding and decoding run
through the ``tokenizers`` library; chat templates render with jinja2 the way Hugging Face does
(``trim_blocks``, ``lstrip_blocks``, ``raise_exception``, ``tojson``, ``strftime_now``).
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import jinja2.sandbox
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from .models.gguf_file import gguf_metadata
from .models.hub import resolve_model

# GGUF token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
_CONTROL, _USER_DEFINED = 3, 4

# Pre-tokenizer split regexes by ``tokenizer.ggml.pre`` (the ones that differ from GPT-2's).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_SPLITS = {
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
}
_DIGIT_SPLIT_PRES = {"smollm", "starcoder", "refact"}  # GPT-2 regex after splitting every digit


class Tokenizer:
    """Encode/decode plus chat template. ``backend`` is the underlying ``tokenizers.Tokenizer``."""

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        extra_eos_token_ids: Sequence[int] = (),
        add_bos_token: bool = False,
    ) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.add_bos_token = add_bos_token
        self.bos_token_id = backend.token_to_id(bos_token) if bos_token else None
        self.eos_token_id = backend.token_to_id(eos_token) if eos_token else None
        eos = [self.eos_token_id] if self.eos_token_id is not None else []
        self.eos_token_ids: list[int] = list(dict.fromkeys(eos + list(extra_eos_token_ids)))
        self.special_ids: set[int] = {
            i for i, tok in backend.get_added_tokens_decoder().items() if tok.special
        }
        # special tokens that decode as text anyway (``keep_as_text``)
        self.text_special_ids: set[int] = set()
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, text: str) -> int | None:
        """The id of the token spelled ``text`` (an added token's content, or a vocabulary
        entry), or None when no single token is."""
        token_id = self.backend.token_to_id(text)
        return None if token_id is None or token_id >= self.vocab_size else token_id

    def keep_as_text(self, texts: Sequence[str]) -> list[str]:
        """Decode the special tokens spelled ``texts`` as text (``skip_special_tokens`` keeps
        them) and let grammars write them: the markers a tool-call or reasoning parser reads,
        which some tokenizers mark special (Mistral's ``[TOOL_CALLS]``). Call before a grammar
        vocabulary is built from this tokenizer. Returns the texts that were special."""
        kept = []
        for text in texts:
            token_id = self.token_id(text)
            if token_id is not None and token_id in self.special_ids:
                self.special_ids.discard(token_id)
                self.text_special_ids.add(token_id)
                kept.append(text)
        return kept

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; a leading BOS only if asked and the model uses one."""
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens and self.add_bos_token and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens and self.text_special_ids:  # skip all specials but the kept
            special = self.special_ids
            return self.backend.decode([i for i in ids if i not in special], False)
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def template_variables(self) -> frozenset[str]:
        """The names the chat template reads from its context (``chat_template_kwargs``)."""
        if self.chat_template is None:
            return frozenset()
        return _template_variables(self.chat_template)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> str | list[int]:
        """Render ``messages`` with the model's chat template (the prompt text, or its ids)."""
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages: expected a non-empty list of {role, content} objects")
        if self.chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        text = _compile_template(self.chat_template).render(
            messages=messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )
        return self.encode(text) if tokenize else text


# --------------------------------------------------------------------------- chat templates


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template: {message}")


def _tojson(
    value: Any, indent: int | None = None, ensure_ascii: bool = False, sort_keys: bool = False
) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=16)
def _compile_template(source: str) -> jinja2.Template:
    return _environment().from_string(source)


@functools.lru_cache(maxsize=16)
def _template_variables(source: str) -> frozenset[str]:
    env = _environment()
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(source)))


# --------------------------------------------------------------------------- loading


def load_tokenizer(model: str | Path | None = None) -> Tokenizer:
    """The tokenizer of ``model`` (same argument as ``Engine``: folder, .gguf file or alias)."""
    path = resolve_model(model)
    if path.suffix == ".gguf":
        return tokenizer_from_gguf(path)
    return tokenizer_from_hf_folder(path)


def tokenizer_from_gguf(path: str | Path) -> Tokenizer:
    """Rebuild the tokenizer from ``tokenizer.ggml.*`` metadata (byte-level BPE or SentencePiece BPE)."""
    meta = gguf_metadata(path, "tokenizer.")
    kind = meta.get("tokenizer.ggml.model")
    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    if kind == "gpt2":
        backend = _byte_level_bpe(tokens, merges, meta.get("tokenizer.ggml.pre"))
    elif kind == "llama" and merges:
        backend = _sentencepiece_bpe(tokens, merges)
    else:
        raise ValueError(
            f"GGUF tokenizer model {kind!r}"
            f"{' without merges' if kind == 'llama' else ''} is not supported "
            "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE with merges); "
            "use the model's Hugging Face folder instead"
        )
    special = [
        AddedToken(t, special=True, normalized=False)
        for t, k in zip(tokens, types)
        if k == _CONTROL
    ]
    user = [
        AddedToken(t, special=False, normalized=False)
        for t, k in zip(tokens, types)
        if k == _USER_DEFINED
    ]
    backend.add_special_tokens(special)
    backend.add_tokens(user)

    def token(key: str) -> str | None:
        index = meta.get(f"tokenizer.ggml.{key}")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    extra_eos = [
        meta[k] for k in ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id") if k in meta
    ]
    return Tokenizer(
        backend,
        chat_template=meta.get("tokenizer.chat_template"),
        bos_token=token("bos_token_id"),
        eos_token=token("eos_token_id"),
        extra_eos_token_ids=extra_eos,
        add_bos_token=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
    )


@functools.lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    )
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return dict(zip(range(256), chars))


def _byte_level_bpe(
    tokens: list[str], merges: list[tuple[str, str]], pre: str | None
) -> HFTokenizer:
    alphabet = set(_bytes_to_unicode().values())
    spell = _bytes_to_unicode()
    vocab: dict[str, int] = {}
    for index, tok in enumerate(tokens):
        key = tok if set(tok) <= alphabet else "".join(spell[b] for b in tok.encode("utf-8"))
        vocab.setdefault(key, index)
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=pre not in _PRE_SPLITS)
    if pre in _PRE_SPLITS:
        steps = [pre_tokenizers.Split(Regex(_PRE_SPLITS[pre]), behavior="isolated"), byte_level]
    elif pre in _DIGIT_SPLIT_PRES:
        steps = [pre_tokenizers.Digits(individual_digits=True), byte_level]
    else:
        steps = [byte_level]
    backend.pre_tokenizer = pre_tokenizers.Sequence(steps)
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(tokens: list[str], merges: list[tuple[str, str]]) -> HFTokenizer:
    vocab = {tok: i for i, tok in enumerate(tokens)}
    backend = HFTokenizer(
        models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="▁", prepend_scheme="first", split=False
    )
    backend.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return backend


def tokenizer_from_hf_folder(path: str | Path) -> Tokenizer:
    """Load ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``generation_config.json`` EOS ids)."""
    path = Path(path)
    if not (path / "tokenizer.json").is_file():
        raise ValueError(f"model: {path} has no tokenizer.json")
    backend = HFTokenizer.from_file(str(path / "tokenizer.json"))
    config = _read_json(path / "tokenizer_config.json")
    gen_config = _read_json(path / "generation_config.json")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next(
            (t["template"] for t in template if t.get("name") == "default"), template[0]["template"]
        )
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    extra_eos = gen_config.get("eos_token_id", [])
    return Tokenizer(
        backend,
        chat_template=template,
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
        extra_eos_token_ids=extra_eos if isinstance(extra_eos, list) else [extra_eos],
        add_bos_token=bool(config.get("add_bos_token", False)),
    )


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_text(value: str | dict | None) -> str | None:
    return value.get("content") if isinstance(value, dict) else value
