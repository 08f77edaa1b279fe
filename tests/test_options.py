"""radixgen.options: dataclass fields -> argparse flags -> the dataclass again."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import pytest

from radixgen.options import add_options, from_args, json_file, option, option_fields


@dataclass(frozen=True)
class Example:
    size: int = option(4, "how many")
    ratio: float | None = option(None, "a ratio (default: none)")
    mode: str = option("a", "the mode", choices=("a", "b"))
    verbose: bool = option(False, "say more")
    cache: bool = option(True, "no cache", flag="--no-cache")
    tags: str | list[str] | None = option(None, "a tag (repeatable)", group="extra")
    hidden: int = 7  # not an option


def _parse(*argv: str, group: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, Example, group=group)
    return parser.parse_args(list(argv))


def test_defaults_round_trip() -> None:
    assert from_args(Example, _parse()) == Example()


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--size", "9"], {"size": 9}),
        (["--ratio", "0.5"], {"ratio": 0.5}),
        (["--mode", "b"], {"mode": "b"}),
        (["--verbose"], {"verbose": True}),
        (["--no-cache"], {"cache": False}),
        (["--tags", "x", "--tags", "y"], {"tags": ["x", "y"]}),
    ],
)
def test_flags_set_fields(argv: list[str], expected: dict[str, object]) -> None:
    assert from_args(Example, _parse(*argv)) == Example(**expected)  # type: ignore[arg-type]


def test_choices_are_enforced() -> None:
    with pytest.raises(SystemExit):
        _parse("--mode", "c")


def test_fields_without_option_are_not_flags() -> None:
    assert [f.name for f, _ in option_fields(Example)] == [
        "size",
        "ratio",
        "mode",
        "verbose",
        "cache",
        "tags",
    ]
    with pytest.raises(SystemExit):
        _parse("--hidden", "1")


def test_group_selects_a_subset_and_from_args_reads_what_is_there() -> None:
    args = _parse("--tags", "x", group="extra")
    assert vars(args) == {"tags": ["x"]}
    assert from_args(Example, args) == Example(tags=["x"])


def test_help_shows_defaults_and_choices() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, Example, notes={"size": "a note"})
    text = parser.format_help()
    assert "how many; a note (default: 4)" in text
    assert "{a,b}" in text and "the mode (default: a)" in text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_true_bool_needs_a_clearing_flag() -> None:
    @dataclass(frozen=True)
    class Bad:
        on: bool = option(True, "on")

    with pytest.raises(TypeError, match="on: a bool option defaulting to True needs a flag"):
        add_options(argparse.ArgumentParser(), Bad)


def test_json_file(tmp_path) -> None:
    good = tmp_path / "s.json"
    good.write_text(json.dumps({"type": "string"}))
    assert json_file(str(good)) == {"type": "string"}
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(argparse.ArgumentTypeError, match="bad.json: not valid JSON"):
        json_file(str(bad))
    with pytest.raises(argparse.ArgumentTypeError, match="cannot read"):
        json_file(str(tmp_path / "missing.json"))
