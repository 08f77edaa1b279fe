"""Extract structured records from free text with a JSON-Schema-constrained ``gen``.

    python examples/json_extraction.py [--max-tokens 64] [--url http://127.0.0.1:30000]

Every output parses and validates against the schema: the grammar masks every token that could
break it. The instruction prefix is shared by all programs, so the radix cache computes it once.
"""

from __future__ import annotations

import argparse
import json

import radixgen as rg

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "maxLength": 20},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
TEXTS = [
    "Maria Lopez, 34, moved to Madrid last spring to open a bakery.",
    "At 71, retired pilot John Okafor still flies gliders near Lagos.",
    "Yuki (19) studies architecture in Kyoto and sketches temples on weekends.",
    "The new mayor of Oslo, 52-year-old Ingrid Berg, took office on Monday.",
]


@rg.function
def extract(s, text, max_tokens):
    s += rg.system("You extract facts as JSON with the keys name, age and city.")
    s += rg.user(f"Text: {text}")
    s += rg.assistant(rg.gen("record", json_schema=SCHEMA, max_tokens=max_tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--url", default=None, help="a radixgen/SGLang server (default: an in-process Engine)"
    )
    args = parser.parse_args()
    backend = rg.RuntimeEndpoint(args.url) if args.url else rg.Engine()
    states = extract.run_batch(
        [{"text": t, "max_tokens": args.max_tokens} for t in TEXTS], backend=backend, temperature=0
    )
    for text, state in zip(TEXTS, states):
        meta = state.get_meta_info("record")
        try:
            record = json.loads(state["record"])
        except json.JSONDecodeError:
            record = f"(cut at --max-tokens {args.max_tokens}) {state['record']}"
        print(
            f"{text}\n  -> {record}  [{meta['completion_tokens']} tokens, {meta['cached_tokens']} cached]"
        )


if __name__ == "__main__":
    main()
