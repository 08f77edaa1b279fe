"""Command line: ``radixgen serve | generate | chat | pull``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from .models.hub import ALIASES, DEFAULT_MODEL


def _engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--model",
        default=None,
        help=f"Hugging Face folder, .gguf file or alias ({', '.join(sorted(ALIASES))}); default {DEFAULT_MODEL}",
    )
    g.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weights and KV dtype (auto: float32 on CPU, bfloat16 on CUDA)",
    )
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto")
    g.add_argument(
        "--max-total-tokens",
        type=int,
        default=None,
        help="KV pool size in tokens (default: sized from memory)",
    )
    g.add_argument(
        "--max-running-requests", type=int, default=64, help="most requests decoding at once"
    )
    g.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=2048,
        help="most prompt tokens computed per step (<= 0: no chunking)",
    )
    g.add_argument(
        "--schedule-policy",
        default="auto",
        choices=["auto", "lpm", "fcfs", "dfs-weight"],
        help="waiting-queue order (auto: lpm with the radix cache, fcfs without)",
    )
    g.add_argument(
        "--disable-radix-cache", action="store_true", help="no prefix sharing across requests"
    )
    g.add_argument(
        "--context-length", type=int, default=None, help="cap the context (default: the model's)"
    )
    g.add_argument(
        "--disable-jump-forward",
        action="store_true",
        help="decode grammar-forced text token by token",
    )
    g.add_argument(
        "--num-threads", type=int, default=None, help="torch CPU threads (default: torch's choice)"
    )


def engine_options(args: argparse.Namespace) -> dict:
    return dict(
        dtype=args.dtype,
        device=args.device,
        max_total_tokens=args.max_total_tokens,
        max_running_requests=args.max_running_requests,
        chunked_prefill_size=args.chunked_prefill_size,
        schedule_policy=args.schedule_policy,
        disable_radix_cache=args.disable_radix_cache,
        context_length=args.context_length,
        jump_forward=not args.disable_jump_forward,
        num_threads=args.num_threads,
    )


def _sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--max-new-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.7)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")


def _sampling_params(args: argparse.Namespace, **constraint):
    from .sampling_params import SamplingParams

    return SamplingParams(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=args.stop,
        **constraint,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="radixgen", description="Structured-generation LLM serving runtime."
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", parents=[common], help="serve the OpenAI-compatible and native HTTP APIs"
    )
    _engine_args(serve)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    serve.add_argument("--served-model-name", default=None, help="model id reported by /v1/models")
    serve.add_argument(
        "--max-queued-requests", type=int, default=256, help="waiting requests before 429"
    )
    serve.add_argument(
        "--max-body-bytes", type=int, default=8 << 20, help="request body limit (413 above)"
    )

    gen = sub.add_parser(
        "generate", parents=[common], help="complete one prompt and print the result"
    )
    gen.add_argument("prompt")
    gen.add_argument(
        "--chat", action="store_true", help="wrap the prompt as a user message (chat template)"
    )
    group = gen.add_mutually_exclusive_group()
    group.add_argument("--json-schema", type=Path, help="constrain to the JSON Schema in this file")
    group.add_argument("--regex", help="constrain to this regular expression")
    group.add_argument(
        "--choice", action="append", help="constrain to one of these strings (repeatable)"
    )
    _engine_args(gen)
    _sampling_args(gen)

    chat = sub.add_parser("chat", parents=[common], help="interactive chat in the terminal")
    chat.add_argument("--system", default=None, help="system prompt")
    _engine_args(chat)
    _sampling_args(chat)

    pull = sub.add_parser("pull", parents=[common], help="fetch a model alias into the cache")
    pull.add_argument(
        "model", nargs="?", default=DEFAULT_MODEL, help=f"alias ({', '.join(sorted(ALIASES))})"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return {"serve": _serve, "generate": _generate, "chat": _chat, "pull": _pull}[args.command](
            args
        )
    except (ValueError, RuntimeError) as exc:
        print(f"radixgen: error: {exc}", file=sys.stderr)
        return 2


def _pull(args: argparse.Namespace) -> int:
    from .models.hub import pull

    if args.model.lower() not in ALIASES:
        raise ValueError(
            f"pull: unknown alias {args.model!r} (known: {', '.join(sorted(ALIASES))})"
        )
    print(pull(args.model))
    return 0


def _generate(args: argparse.Namespace) -> int:
    from .engine import Engine

    constraint = {}
    if args.json_schema:
        constraint["json_schema"] = json.loads(args.json_schema.read_text())
    elif args.regex:
        constraint["regex"] = args.regex
    elif args.choice:
        constraint["choices"] = args.choice
    params = _sampling_params(args, **constraint)
    engine = Engine(args.model, **engine_options(args))
    try:
        prompt = [{"role": "user", "content": args.prompt}] if args.chat else args.prompt
        for delta in engine.stream(prompt, params):
            print(delta.text, end="", flush=True)
        print()
    finally:
        engine.shutdown()
    return 0


def _chat(args: argparse.Namespace) -> int:
    from .engine import Engine

    engine = Engine(args.model, **engine_options(args))
    params = _sampling_params(args)
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


def _print_through(deltas):
    for delta in deltas:
        print(delta.text, end="", flush=True)
        yield delta.text


def _serve(args: argparse.Namespace) -> int:
    from .server.app import serve

    serve(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
