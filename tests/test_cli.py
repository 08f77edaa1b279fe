"""radixgen.cli: the flags come from EngineConfig, ServerSettings and SamplingParams."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from radixgen.cli import build_parser
from radixgen.config import EngineConfig
from radixgen.options import from_args, option_fields
from radixgen.sampling_params import SamplingParams
from radixgen.server.settings import ServerSettings


def _flags(command: str) -> set[str]:
    sub = build_parser()._subparsers._group_actions[0].choices[command]  # type: ignore[union-attr]
    return {flag for action in sub._actions for flag in action.option_strings}


ENGINE_FLAGS = {
    "--model",
    "--dtype",
    "--quantization",
    "--quant-activations",
    "--cpu-amx",
    "--kv-cache-dtype",
    "--device",
    "--max-total-tokens",
    "--max-running-requests",
    "--chunked-prefill-size",
    "--max-step-ms",
    "--kv-memory-fraction",
    "--cuda-graph-max-bs",  # issue #18
    "--disable-cuda-graph",
    "--schedule-policy",
    "--disable-radix-cache",
    "--lora-paths",
    "--enable-lora",
    "--max-loras-per-batch",
    "--max-loaded-loras",
    "--max-lora-rank",
    "--enable-kv-events",
    "--hicache-ratio",
    "--hicache-dtype",
    "--hicache-dir",
    "--hicache-disk-gb",
    "--enable-deterministic-inference",  # SGLang's name
    "--context-length",
    "--disable-jump-forward",
    "--grammar-backend",
    "--num-threads",
    "--numa-node",
    "--speculative-algorithm",  # issue #20
    "--speculative-num-tokens",
    "--dp-size",  # issue #19
    "--dp",
    "--tp-size",
    "--tp",
    "--nnodes",
    "--node-rank",
    "--dist-init-addr",
    "--speculative-draft-model",
    "--reasoning-parser",  # issue #50
    "--tool-call-parser",
    "--enable-priority-scheduling",  # issue #51
    "--schedule-low-priority-values-first",
}
SAMPLING_FLAGS = {
    "--max-new-tokens",
    "--temperature",
    "--top-p",
    "--top-k",
    "--seed",
    "--stop",
    "--max-thinking-tokens",  # issue #50
}
SERVER_FLAGS = {
    "--host",
    "--port",
    "--api-key",
    "--served-model-name",
    "--max-queued-requests",
    "--max-body-bytes",
    "--shutdown-timeout",
    "--header-timeout",
    "--body-timeout",
    "--keep-alive-timeout",
    "--max-connections",
    "--router-policy",
    "--tool-strict-level",  # issue #50
}
ROUTER_FLAGS = {
    "--worker-urls",
    "--policy",
    "--host",
    "--port",
    "--cache-threshold",
    "--balance-abs-threshold",
    "--balance-rel-threshold",
    "--health-interval",
}


@pytest.mark.parametrize(
    "command, flags",
    [
        ("serve", ENGINE_FLAGS | SERVER_FLAGS | {"--log-level"}),
        (
            "generate",
            ENGINE_FLAGS
            | SAMPLING_FLAGS
            | {"--chat", "--json-schema", "--regex", "--ebnf", "--choice", "--structural-tag"}
            | {"--log-level"},
        ),
        ("chat", ENGINE_FLAGS | SAMPLING_FLAGS | {"--system", "--log-level"}),
        ("pull", {"--log-level"}),
        ("router", ROUTER_FLAGS | {"--log-level"}),
    ],
)
def test_flag_names_are_the_public_contract(command: str, flags: set[str]) -> None:
    assert _flags(command) == flags | {"-h", "--help"}


@pytest.mark.parametrize("command", ["serve", "generate", "chat"])
def test_defaults_are_the_dataclasses(command: str) -> None:
    argv = [command, "prompt"] if command == "generate" else [command]
    args = build_parser().parse_args(argv)
    assert from_args(EngineConfig, args) == EngineConfig()
    if command == "serve":
        assert from_args(ServerSettings, args) == ServerSettings()
    else:
        assert from_args(SamplingParams, args) == SamplingParams()


def test_generate_flags_build_sampling_params(tmp_path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "integer"}))
    args = build_parser().parse_args(
        ["generate", "p", "--json-schema", str(schema), "--temperature", "0", "--stop", "\n"]
    )
    params = from_args(SamplingParams, args)
    assert params == SamplingParams(json_schema={"type": "integer"}, temperature=0.0, stop=["\n"])
    choice = build_parser().parse_args(["generate", "p", "--choice", "yes", "--choice", "no"])
    assert from_args(SamplingParams, choice).choices == ["yes", "no"]


def test_constraint_flags_exclude_each_other() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["generate", "p", "--regex", "a", "--choice", "a"])


def test_serve_and_engine_flags_parse() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--port",
            "8000",
            "--api-key",
            "k",
            "--disable-jump-forward",
            "--dtype",
            "float32",
        ]
    )
    assert from_args(ServerSettings, args) == ServerSettings(port=8000, api_key="k")
    assert from_args(EngineConfig, args) == EngineConfig(jump_forward=False, dtype="float32")


def test_served_model_name_takes_several_names() -> None:
    """vLLM's ``--served-model-name a b``: one flag, several values."""
    args = build_parser().parse_args(["serve", "--served-model-name", "smol", "gpt-4o-mini"])
    assert from_args(ServerSettings, args).served_model_name == ["smol", "gpt-4o-mini"]


def test_every_option_field_has_a_flag() -> None:
    flags = _flags("serve") | _flags("generate")
    for cls in (EngineConfig, ServerSettings, SamplingParams):
        for f, spec in option_fields(cls):
            assert spec.flag_for(f.name) in flags, f.name


@pytest.mark.parametrize("command", ["generate", "serve"])
def test_help_shows_defaults_and_choices(command: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "radixgen", command, "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "{auto,lpm,fcfs,dfs-weight}" in out and "(default: 2048)" in out
    if command == "serve":
        assert "(default: 30000)" in out and "(default: 127.0.0.1)" in out
    else:
        assert "(default: 128)" in out and "--choice CHOICE" in out


def test_help_does_not_import_torch() -> None:
    code = "import sys; from radixgen.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cuda-graph-max-bs", "-1"], "--cuda-graph-max-bs: expected 0 to 1024, got -1"),
        (["--context-length", "0"], "--context-length: expected >= 2 tokens, got 0"),
        (["--num-threads", "0"], "--num-threads: expected >= 1, got 0"),
        (["--numa-node", "isolate"], "--numa-node: expected auto, off or a node number"),
        (["--device", "bogus"], "--device: expected auto, cpu, cuda or cuda:N, got 'bogus'"),
        (["--device", "cpu:7"], "--device: expected auto, cpu, cuda or cuda:N"),
    ],
)
def test_a_bad_engine_flag_is_named_before_the_model_loads(capsys, monkeypatch, argv, message):
    """The dataclasses' checks name fields (the Python API's names); the CLI names its flags,
    and checks them before making an engine."""
    from radixgen import cli

    def no_engine(args):
        raise AssertionError("the engine was made before the flags were checked")

    monkeypatch.setattr(cli, "_engine", no_engine)
    assert cli.main(["generate", "hi", *argv]) == 2
    assert f"radixgen: error: {message}" in capsys.readouterr().err
