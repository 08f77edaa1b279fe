"""Shared fixtures: the default model (loaded once per test session)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

# `python -m pytest` puts the repository root on sys.path, where the top-level kernels/ folder
# (installed as radixgen.kernels) would shadow Hugging Face's `kernels` package, which
# transformers (>= 5.25) imports. radixgen's own packages come from the installed mapping, so
# the root is taken off the path before anything imports transformers.
REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != REPO_ROOT]

import pytest  # noqa: E402 - after the path fix above
import torch  # noqa: E402
from live_server import (  # noqa: E402
    SERVER_API_KEY,
    SERVER_BODY_LIMIT,
    _free_port,
    _wait_healthy,
)

# Triton reads TRITON_INTERPRET when triton.language is first imported, and test modules of
# any folder may import radixgen.kernels (hence triton) while pytest collects: set it here,
# before any of them, so that the kernel tests run Triton's CPU interpreter without a GPU.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

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
def tiny_model_folder(tmp_path_factory, tokenizer):
    """A 2-layer random-weight Llama (GQA 4/2) with the default model's tokenizer, as an HF folder:
    a real engine or server whose steps take milliseconds (kernel, fuzzing and property tests)."""
    pytest.importorskip("transformers")
    from families import save_tiny_llama

    config = {
        "chat_template": tokenizer.chat_template,
        "eos_token": "<|im_end|>",
        "bos_token": "<|im_start|>",
    }
    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"), tokenizer.backend, config)


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

    return AutoTokenizer.from_pretrained(
        str(default_model_path.parent), gguf_file=default_model_path.name
    )


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (JSON-schema corpora, GSM8K, MT-bench); tests skip when it is absent."""
    return SHARED_DATA


def _default_model_server(tmp_path_factory: pytest.TempPathFactory, name: str, *extra: str):
    """Runs ``radixgen serve`` of the default model (127.0.0.1, a free port, ``--api-key
    test-key``, a small body limit, ``extra`` options) and yields its URL; its log is printed if
    start-up fails; after the session it must have shut down cleanly."""
    port = _free_port()
    log = tmp_path_factory.mktemp(name) / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "radixgen",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--api-key",
        SERVER_API_KEY,
        "--max-body-bytes",
        str(SERVER_BODY_LIMIT),
        "--max-total-tokens",
        "16384",
        *extra,
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)  # graceful shutdown within the grace period
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    # uvicorn re-raises SIGTERM after a clean shutdown, so -SIGTERM is a normal exit too
    text = log.read_text()
    assert proc.returncode in (0, -signal.SIGTERM), (
        f"radixgen serve exited with {proc.returncode}:\n{text[-4000:]}"
    )
    assert "Application shutdown complete" in text and "Traceback" not in text, text[-4000:]


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory):
    """One live ``radixgen serve`` of the default model (``_default_model_server``) shared by the
    server, DSL and client tests."""
    yield from _default_model_server(tmp_path_factory, "server")


@pytest.fixture(scope="session")
def llguidance_server_url(tmp_path_factory: pytest.TempPathFactory):
    """The default model served with ``--grammar-backend llguidance``: grammars in llguidance's
    Lark format (what guidance sends as ``ebnf`` / ``guided_grammar``) compile there."""
    yield from _default_model_server(
        tmp_path_factory, "llguidance-server", "--grammar-backend", "llguidance"
    )


@pytest.fixture(scope="session")
def tiny_server_url(tmp_path_factory: pytest.TempPathFactory, tiny_model_folder: Path):
    """A live ``radixgen serve`` of ``tiny_model_folder`` (served as ``tiny``, ``--api-key
    test-key``, the test body limit): requests take milliseconds, so fuzzers can send many. Its
    log is printed if start-up fails; after the session it must have shut down cleanly."""
    port = _free_port()
    log = tmp_path_factory.mktemp("tiny-server") / "server.log"
    cmd = [
        *(sys.executable, "-m", "radixgen", "serve", "--model", str(tiny_model_folder)),
        *("--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port)),
        *("--api-key", SERVER_API_KEY, "--max-body-bytes", str(SERVER_BODY_LIMIT)),
        *("--max-total-tokens", "8192", "--num-threads", "1", "--log-level", "warning"),
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert proc.returncode in (0, -signal.SIGTERM), text[-4000:]
    assert "Traceback" not in text, text[-4000:]
