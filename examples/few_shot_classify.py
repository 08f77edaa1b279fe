"""Few-shot classification with ``select``: the examples form a long shared prefix (computed once,
then served from the radix cache) and each label is scored by its token logprobs.

    python examples/few_shot_classify.py [--max-tokens N (unused: select generates nothing)] [--url URL]
"""

from __future__ import annotations

import argparse

import radixgen as rg

LABELS = ["positive", "negative"]
EXAMPLES = [
    ("The food was wonderful and the staff were kind.", "positive"),
    ("Cold soup, rude waiter, never again.", "negative"),
    ("Absolutely loved the dessert!", "positive"),
    ("We waited an hour and the order was wrong.", "negative"),
]
REVIEWS = [
    ("Great atmosphere and delicious pasta.", "positive"),
    ("The room was dirty and smelled bad.", "negative"),
    ("Friendly service, I will come back.", "positive"),
    ("Overpriced and tasteless.", "negative"),
    ("A perfect evening, thank you!", "positive"),
    ("My steak was burnt and nobody cared.", "negative"),
]


@rg.function
def classify(s, review):
    s += "Classify the sentiment of each review as positive or negative.\n\n"
    for text, label in EXAMPLES:
        s += f"Review: {text}\nSentiment: {label}\n\n"
    s += f"Review: {review}\nSentiment: " + rg.select("label", choices=LABELS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--max-tokens", type=int, default=8, help="accepted for symmetry; select needs none"
    )
    parser.add_argument(
        "--url", default=None, help="a radixgen/SGLang server (default: an in-process Engine)"
    )
    args = parser.parse_args()
    backend = rg.RuntimeEndpoint(args.url) if args.url else rg.Engine()
    classify.run(review=REVIEWS[0][0], backend=backend)  # computes the few-shot prefix once
    states = classify.run_batch([{"review": text} for text, _ in REVIEWS], backend=backend)
    correct = 0
    for (text, truth), state in zip(REVIEWS, states):
        meta = state.get_meta_info("label")
        correct += state["label"] == truth
        scores = meta.get("normalized_logprobs")
        shown = f" scores {[round(x, 2) for x in scores]}" if scores else ""
        print(
            f"{state['label']:>8}  (expected {truth}) {text}{shown}  [{meta['cached_tokens']} cached]"
        )
    print(f"accuracy {correct}/{len(REVIEWS)}")


if __name__ == "__main__":
    main()
