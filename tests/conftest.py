"""Shared fixtures: the default model (loaded once per test session)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("RADIXGEN_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    from radixgen.models.hub import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def tokenizer(default_model_path):
    from radixgen import load_tokenizer

    return load_tokenizer(default_model_path)


@pytest.fixture(scope="session")
def engine(default_model_path):
    from radixgen import Engine

    eng = Engine(str(default_model_path), max_total_tokens=16384)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def hf_gguf_model(default_model_path):
    """transformers' own GGUF loader on the same file: the reference implementation."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        str(default_model_path.parent), gguf_file=default_model_path.name, dtype=torch.float32
    ).eval()


@pytest.fixture(scope="session")
def hf_gguf_tokenizer(default_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(default_model_path.parent), gguf_file=default_model_path.name)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (JSON-schema corpora, GSM8K, MT-bench); tests skip when it is absent."""
    return SHARED_DATA
