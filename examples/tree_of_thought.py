"""Tree of thought with ``fork``: several branches continue one shared prompt (cached once and
reused by every branch), each branch is judged with ``select``, and the best is expanded.

    python examples/tree_of_thought.py [--max-tokens 32] [--branches 3] [--url URL]
"""

from __future__ import annotations

import argparse

import radixgen as rg
from radixgen.lang import assistant_begin, assistant_end

QUESTION = "How can a small town reduce traffic in its centre?"


@rg.function
def tree_of_thought(s, question, branches, max_tokens):
    s += rg.system("You are a practical city planner.")
    s += rg.user(f"{question} Give one concrete idea.")
    s += assistant_begin() + "Idea:"
    ideas = s.fork(branches)  # every branch continues the open assistant turn
    for i, branch in enumerate(ideas):
        branch += (
            rg.gen("idea", max_tokens=max_tokens, temperature=0.8, seed=i, stop="\n")
            + assistant_end()
        )
        branch += rg.user("Is this idea realistic? Answer yes or no.")
        branch += rg.assistant(rg.select("realistic", choices=["yes", "no"]))
    ideas.join()  # s["idea"] and s["realistic"] are now lists, one entry per branch
    best = next((i for i, verdict in enumerate(s["realistic"]) if verdict == "yes"), 0)
    s += s["idea"][best] + assistant_end()
    s += rg.user("Explain in two steps how to carry out this idea.")
    s += rg.assistant(rg.gen("plan", max_tokens=max_tokens))
    return ideas, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--branches", type=int, default=3)
    parser.add_argument(
        "--url", default=None, help="a radixgen/SGLang server (default: an in-process Engine)"
    )
    args = parser.parse_args()
    backend = rg.RuntimeEndpoint(args.url) if args.url else rg.Engine()
    state = tree_of_thought.run(
        question=QUESTION,
        branches=args.branches,
        max_tokens=args.max_tokens,
        backend=backend,
        temperature=0,
    )
    ideas, best = state.ret_value
    print(QUESTION)
    for i in range(args.branches):
        meta = ideas[i].get_meta_info("idea")
        mark = "*" if i == best else " "
        print(
            f" {mark} idea {i}: {ideas[i]['idea'].strip()!r}  realistic: {ideas[i]['realistic']}  "
            f"[{meta['cached_tokens']}/{meta['prompt_tokens']} prompt tokens cached]"
        )
    print(f"plan: {state['plan'].strip()}")
    print(
        f"tokens: {state.meta['completion_tokens']} generated, {state.meta['cached_tokens']} cached"
    )


if __name__ == "__main__":
    main()
