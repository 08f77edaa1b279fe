"""Command line: ``radixgen serve | router | generate | chat | pull``.

The engine, server and sampling flags are generated from ``EngineConfig``, ``ServerSettings`` and
``SamplingParams`` (``radixgen.options``): their names, defaults, choices and help live with those
dataclasses, and parsed flags go back into them with ``from_args``.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from .config import EngineConfig
from .models.hub import ALIASES, DEFAULT_MODEL, pull
from .options import add_options, from_args, option_fields
from .router.replicas import LOG_TAG_ENV, exit_with_parent
from .router.settings import RouterSettings
from .sampling_params import SamplingParams
from .server.settings import ServerSettings

if TYPE_CHECKING:
    from .engine import Engine
    from .request import Delta

_ALIASES = ", ".join(sorted(ALIASES))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixgen", description="Structured-generation LLM serving runtime."
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="logging level (default: info)",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", parents=[common], help="serve the OpenAI-compatible and native HTTP APIs"
    )
    _engine_args(serve)
    add_options(serve.add_argument_group("server"), ServerSettings)

    router = sub.add_parser(
        "router",
        parents=[common],
        help="route requests to several radixgen serve hosts (cache-aware)",
    )
    add_options(router, RouterSettings)

    gen = sub.add_parser(
        "generate", parents=[common], help="complete one prompt and print the result"
    )
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user message (chat template)"
    )
    constraint = gen.add_argument_group("constraint (at most one)")
    add_options(constraint.add_mutually_exclusive_group(), SamplingParams, group="constraint")
    _engine_args(gen)
    add_options(gen.add_argument_group("sampling"), SamplingParams, group="sampling")

    chat = sub.add_parser("chat", parents=[common], help="interactive chat in the terminal")
    chat.add_argument("--system", default=None, help="system prompt")
    _engine_args(chat)
    add_options(chat.add_argument_group("sampling"), SamplingParams, group="sampling")

    pull_cmd = sub.add_parser("pull", parents=[common], help="fetch a model alias into the cache")
    pull_cmd.add_argument(
        "model",
        nargs="?",
        default=DEFAULT_MODEL,
        help=f"alias ({_ALIASES}; default: {DEFAULT_MODEL})",
    )
    return parser


def _engine_args(parser: argparse.ArgumentParser) -> None:
    notes = {"model": f"aliases: {_ALIASES} (default: {DEFAULT_MODEL})"}
    add_options(parser.add_argument_group("engine"), EngineConfig, notes=notes)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tag = os.environ.get(LOG_TAG_ENV, "")  # "[dp 1] " in a data-parallel replica
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s {tag}%(levelname)s %(name)s: %(message)s",
    )
    commands = {
        "serve": _serve,
        "router": _router,
        "generate": _generate,
        "chat": _chat,
        "pull": _pull,
    }
    try:
        if args.command in ("serve", "generate", "chat"):
            from_args(EngineConfig, args).validate()  # before the model loads
        return commands[args.command](args)
    except (ValueError, RuntimeError) as exc:
        print(f"radixgen: error: {in_flag_terms(str(exc), args.command)}", file=sys.stderr)
        return 2


def in_flag_terms(message: str, command: str) -> str:
    """``message`` with a leading option field name (``max_total_tokens: ...``, as the
    dataclasses' checks name them for the Python API) given as the command's flag."""
    field, sep, rest = message.partition(":")
    if not sep:
        return message
    settings = {"router": (RouterSettings,), "serve": (EngineConfig, ServerSettings)}
    for cls in settings.get(command, (EngineConfig, SamplingParams)):
        for f, spec in option_fields(cls):
            if f.name == field:
                return spec.flag_for(field) + sep + rest
    return message


def _pull(args: argparse.Namespace) -> int:
    if args.model.lower() not in ALIASES:
        raise ValueError(f"pull: unknown alias {args.model!r} (known: {_ALIASES})")
    print(pull(args.model))
    return 0


def _engine(args: argparse.Namespace) -> Engine:
    """Load the engine the flags describe. Imported here, not at module level: the engine
    pulls in torch and the model code (about 1.5 s), which ``radixgen --help`` and ``pull``
    don't need. This is start-up time, not an import cycle."""
    from .engine import Engine

    return Engine(**dataclasses.asdict(from_args(EngineConfig, args)))


def _generate(args: argparse.Namespace) -> int:
    params = from_args(SamplingParams, args)
    engine = _engine(args)
    try:
        prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
        for _ in _print_through(engine.stream(prompt, params)):
            pass
        print()
    finally:
        engine.shutdown()
    return 0


def _chat(args: argparse.Namespace) -> int:
    params = from_args(SamplingParams, args)
    engine = _engine(args)
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print("radixgen chat — empty line or Ctrl-D to quit", file=sys.stderr)
    try:
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                break
            if not line:
                break
            messages.append({"role": "user", "content": line})
            print("assistant> ", end="", flush=True)
            reply = "".join(_print_through(engine.stream(messages, params)))
            messages.append({"role": "assistant", "content": reply})
            print()
    finally:
        engine.shutdown()
    return 0


def _print_through(deltas: Iterable[Delta]) -> Iterator[str]:
    for delta in deltas:
        print(delta.text, end="", flush=True)
        yield delta.text


def _router(args: argparse.Namespace) -> int:
    from .router.replicas import serve_router

    serve_router(from_args(RouterSettings, args), args.log_level)
    return 0


def _serve(args: argparse.Namespace) -> int:
    # Imported here for start-up time like the engine (the server imports torch through it).
    from .server.app import serve

    config = from_args(EngineConfig, args)
    exit_with_parent()  # a data-parallel replica goes when its router does
    if config.dp_size > 1:
        from .router.replicas import serve_replicas

        serve_replicas(config.validate(), from_args(ServerSettings, args), args.log_level)
        return 0
    if config.tp_size > 1 and (config.node_rank or int(os.environ.get("RANK", "0"))):
        # another host's ranks (--node-rank) or a torchrun rank other than 0: no HTTP here
        from .tp_worker import serve_node

        return serve_node(config.validate())
    serve(config, from_args(ServerSettings, args), args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
