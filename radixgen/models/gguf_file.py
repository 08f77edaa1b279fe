"""Open a GGUF file once and read its metadata as plain Python values."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np


@functools.lru_cache(maxsize=2)
def open_gguf(path: str):
    """A cached ``gguf.GGUFReader`` (opening one parses every header: ~seconds for big vocabularies)."""
    from gguf import GGUFReader

    return GGUFReader(path)


def release_gguf() -> None:
    """Drop the cached readers once a model is loaded: each holds a memory map of its file, whose
    pages, once read, count in the process's RSS (94 MB for the default model) though the
    weights were copied out. A later open maps the file again."""
    open_gguf.cache_clear()


def gguf_metadata(path: str | Path, prefix: str = "") -> dict[str, Any]:
    """Metadata fields whose key starts with ``prefix``, decoded to str/int/float/list values."""
    reader = open_gguf(str(path))
    out: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith(prefix) and not key.startswith("GGUF."):
            out[key] = _field_value(field)
    return out


def _field_value(field) -> Any:
    from gguf import GGUFValueType

    kinds = field.types
    if not kinds:
        return None
    if kinds[0] == GGUFValueType.ARRAY:
        if kinds[-1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return np.concatenate([field.parts[i] for i in field.data]).tolist() if field.data else []
    if kinds[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    value = field.parts[field.data[0]]
    return value.item() if value.size == 1 else value.tolist()
