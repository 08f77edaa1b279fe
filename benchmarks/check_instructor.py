"""Issue #17's acceptance check: instructor's default TOOLS mode on the default model.

N instructor ``Mode.TOOLS`` calls (default, non-strict schemas made by pydantic; instructor's own
request, unmodified; no retries) at ``max_tokens`` 128 against a running server: every one must
return a validated object. Prints each result, the count and the time; exits 1 if any failed.

    radixgen serve --api-key test-key &
    python benchmarks/check_instructor.py --base-url http://127.0.0.1:30000 --api-key test-key
"""

from __future__ import annotations

import argparse
import sys
import time

import instructor
import openai
from pydantic import BaseModel


class User(BaseModel):
    name: str
    age: int


class Book(BaseModel):
    title: str
    year: int
    authors: list[str]


class Meeting(BaseModel):
    topic: str
    day: str
    attendees: int
    online: bool


# (response model, text to extract from); cycled through for N calls
CASES: list[tuple[type[BaseModel], str]] = [
    (User, "John Smith is 31 years old."),
    (User, "Maria Garcia, aged 47, lives in Madrid."),
    (User, "Bob is a 19 year old student."),
    (User, "Our new hire, Priya Patel (28), starts Monday."),
    (User, "At 65, Hiroshi Tanaka retired from teaching."),
    (Book, "Dune was written by Frank Herbert and published in 1965."),
    (Book, "Good Omens (1990) by Terry Pratchett and Neil Gaiman."),
    (Book, "In 1813 Jane Austen published Pride and Prejudice."),
    (Meeting, "Budget review on Tuesday with 6 people, held over video call."),
    (Meeting, "The design sync is Friday in room 4B; 3 attendees."),
]


def extract(client: instructor.Instructor, model: str, case: tuple[type[BaseModel], str]) -> str:
    """One TOOLS-mode call; the validated object's repr (raises on any failure)."""
    response_model, text = case
    result = client.chat.completions.create(
        model=model,
        response_model=response_model,
        max_tokens=128,
        max_retries=0,
        messages=[{"role": "user", "content": f"Extract the {response_model.__name__}: {text}"}],
    )
    assert isinstance(result, response_model)
    return repr(result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:30000")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    raw = openai.OpenAI(base_url=f"{args.base_url}/v1", api_key=args.api_key, max_retries=0)
    client = instructor.from_openai(raw, mode=instructor.Mode.TOOLS)
    ok = 0
    start = time.perf_counter()
    for i in range(args.calls):
        t0 = time.perf_counter()
        try:
            line = extract(client, args.model, CASES[i % len(CASES)])
            ok += 1
        except Exception as e:  # a failed call is counted and shown, then the run goes on
            line = f"FAILED {type(e).__name__}: {str(e)[:400]}"
        print(f"{i + 1:3d} {time.perf_counter() - t0:6.2f}s {line}")
    total = time.perf_counter() - start
    print(f"{ok}/{args.calls} validated objects in {total:.1f}s ({total / args.calls:.2f}s a call)")
    return 0 if ok == args.calls else 1


if __name__ == "__main__":
    sys.exit(main())
