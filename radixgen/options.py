"""Command-line options generated from the config dataclasses, so each option is stated once.

A dataclass field declared with :func:`option` is a flag: its name, type, default, choices and
help come from the field, and :func:`from_args` reads the parsed flags back into the dataclass::

    @dataclass(frozen=True)
    class ServerSettings:
        port: int = option(30000, "TCP port")              # --port PORT (default: 30000)

    add_options(parser, ServerSettings)
    settings = from_args(ServerSettings, parser.parse_args())

Rules: the flag is ``--field-name`` unless ``flag`` says otherwise; ``X | None`` takes an ``X``;
a ``bool`` defaulting to False is a switch that sets it, one defaulting to True needs a ``flag``
(such as ``--disable-jump-forward``) that clears it; a field that may hold a list
(``str | list[str] | None``) takes a repeatable flag; ``parse`` replaces the value's type
(a function of the flag's string). The default is shown in the help unless it is None or a switch
(a None default's meaning belongs in the help text). Fields without ``option`` are not flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

_KEY = "radixgen.option"  # the field-metadata key holding an option's Option


@dataclasses.dataclass(frozen=True)
class Option:
    """How one dataclass field appears on the command line (see the module docstring)."""

    help: str
    flag: str | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    group: str | None = None  # a name callers select a subset by (``add_options(group=...)``)
    nargs: str | None = None  # a list flag taking its values at once (``--x a b``), not repeated
    aliases: tuple[str, ...] = ()  # more flags for the same field (``--tp`` of ``--tp-size``)

    def flag_for(self, name: str) -> str:
        """The flag of field ``name``: ``flag``, or ``--`` + the name with dashes."""
        return self.flag or "--" + name.replace("_", "-")


class ArgumentContainer(Protocol):
    """A parser, an argument group or a mutually exclusive group."""

    def add_argument(self, *flags: str, **kwargs: Any) -> argparse.Action: ...


def option(
    default: T,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
    metavar: str | None = None,
    parse: Callable[[str], Any] | None = None,
    group: str | None = None,
    nargs: str | None = None,
    aliases: tuple[str, ...] = (),
) -> T:
    """A dataclass field with ``default`` that is also a command-line flag."""
    spec = Option(help, flag, choices, metavar, parse, group, nargs, aliases)
    return dataclasses.field(default=default, metadata={_KEY: spec})


def option_fields(
    cls: type, group: str | None = None
) -> list[tuple[dataclasses.Field[Any], Option]]:
    """The fields of dataclass ``cls`` declared with :func:`option` (in ``group``, when given)."""
    found = []
    for f in dataclasses.fields(cls):
        spec = f.metadata.get(_KEY)
        if spec is not None and (group is None or spec.group == group):
            found.append((f, spec))
    return found


def add_options(
    parser: ArgumentContainer,
    cls: type,
    *,
    group: str | None = None,
    notes: dict[str, str] | None = None,
) -> None:
    """Add a flag to ``parser`` for each option field of ``cls`` (those in ``group`` if given).

    ``notes``: text appended to a field's help where only the caller knows it (e.g. the model
    aliases, which the config module does not import).
    """
    hints = typing.get_type_hints(cls)
    for f, spec in option_fields(cls, group):
        extra = (notes or {}).get(f.name)
        help_text = f"{spec.help}; {extra}" if extra else spec.help
        argument = _argument(f, spec, hints[f.name], help_text)
        parser.add_argument(spec.flag_for(f.name), *spec.aliases, dest=f.name, **argument)


def _argument(f: dataclasses.Field[Any], spec: Option, hint: Any, help_text: str) -> dict[str, Any]:
    default = f.default
    if hint is bool:
        if default is True and spec.flag is None:
            raise TypeError(
                f"{f.name}: a bool option defaulting to True needs a flag that clears it"
            )
        return {"action": "store_false" if default else "store_true", "help": help_text}
    members = [m for m in _union_members(hint) if m is not type(None)]
    lists = [m for m in members if typing.get_origin(m) is list]
    scalar = typing.get_args(lists[0])[0] if lists else members[0]
    argument: dict[str, Any] = {
        "default": default,
        "type": spec.parse or scalar,
        "help": help_text if default is None else f"{help_text} (default: {default})",
    }
    if spec.nargs is not None:
        argument["nargs"] = spec.nargs
    elif lists:
        argument["action"] = "append"
    if spec.choices is not None:
        argument["choices"] = spec.choices
    if spec.metavar is not None:
        argument["metavar"] = spec.metavar
    return argument


def _union_members(hint: Any) -> tuple[Any, ...]:
    if typing.get_origin(hint) is typing.Union or isinstance(hint, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def json_file(path: str) -> Any:
    """``parse`` for a flag naming a JSON file: the file's value."""
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path}: not valid JSON ({exc})") from None


def text_file(path: str) -> str:
    """``parse`` for a flag naming a text file (a grammar): the file's text."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{path}: not UTF-8 text ({exc})") from None


def option_values(cls: type, args: argparse.Namespace) -> dict[str, Any]:
    """The option fields of ``cls`` found in ``args`` (flags ``add_options`` added), by name."""
    return {f.name: getattr(args, f.name) for f, _ in option_fields(cls) if hasattr(args, f.name)}


def to_argv(obj: Any, skip: tuple[str, ...] = ()) -> list[str]:
    """The flags that give back ``obj``'s option fields through :func:`from_args` (those that
    differ from their defaults, except ``skip``): how a process passes its options on."""
    argv: list[str] = []
    for f, spec in option_fields(type(obj)):
        value = getattr(obj, f.name)
        if f.name in skip or value == f.default:
            continue
        flag = spec.flag_for(f.name)
        if isinstance(value, bool):
            argv.append(flag)  # a switch (or, for a True default, its clearing flag)
        elif isinstance(value, list):
            if spec.nargs is not None:
                argv += [flag, *map(str, value)]
            else:
                argv += [item for v in value for item in (flag, str(v))]
        else:
            argv += [flag, str(value)]
    return argv


def from_args(cls: type[T], args: argparse.Namespace, **fields: Any) -> T:
    """An instance of dataclass ``cls`` from parsed flags; ``fields`` set the others."""
    return cls(**option_values(cls, args), **fields)
