"""A multi-turn chat as one program: each turn's prompt extends the previous one, so every turn
reuses the conversation so far from the radix cache.

    python examples/multi_turn_chat.py [--max-tokens 48] [--url http://127.0.0.1:30000]
"""

from __future__ import annotations

import argparse

import radixgen as rg

QUESTIONS = [
    "What is the largest planet in the solar system?",
    "How many moons does it have?",
    "Name one of them.",
]


@rg.function
def conversation(s, questions, max_tokens):
    s += rg.system("You are a friendly astronomy tutor. Answer in one or two sentences.")
    for i, question in enumerate(questions):
        s += rg.user(question)
        s += rg.assistant(rg.gen(f"answer_{i}", max_tokens=max_tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument(
        "--url", default=None, help="a radixgen/SGLang server (default: an in-process Engine)"
    )
    args = parser.parse_args()
    backend = rg.RuntimeEndpoint(args.url) if args.url else rg.Engine()
    state = conversation.run(
        questions=QUESTIONS, max_tokens=args.max_tokens, backend=backend, temperature=0
    )
    for i, message in enumerate(m for m in state.messages() if m["role"] != "system"):
        print(f"{message['role']:>9}: {message['content']}")
        if message["role"] == "assistant":
            meta = state.get_meta_info(f"answer_{i // 2}")
            print(
                f"{'':>11}[prompt {meta['prompt_tokens']} tokens, {meta['cached_tokens']} from the cache]"
            )
    totals = state.meta
    print(
        f"total: {totals['prompt_tokens']} prompt tokens, {totals['cached_tokens']} cached, "
        f"{totals['completion_tokens']} generated"
    )


if __name__ == "__main__":
    main()
