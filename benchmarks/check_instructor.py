"""Issue #17's acceptance check: instructor's default TOOLS mode on the default model.

20 instructor ``Mode.TOOLS`` calls, one per case below (default, non-strict schemas made by
pydantic; instructor's own request, unmodified; no retries), at ``max_tokens`` 128 against a
running server: every one must return a validated object. Prints each result, the count and the time; exits 1 if any failed.

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


# (response model, text to extract from): one call each
CASES: list[tuple[type[BaseModel], str]] = [
    (User, "John Smith is 31 years old."),
    (User, "Maria Garcia, aged 47, lives in Madrid."),
    (User, "Bob is a 19 year old student."),
    (User, "Our new hire, Priya Patel (28), starts Monday."),
    (User, "At 65, Hiroshi Tanaka retired from teaching."),
    (User, "Lena Novak turned 40 last week."),
    (User, "The winner, 12-year-old Sam Lee, was thrilled."),
    (User, "Ahmed Khan (age 53) chairs the board."),
    (Book, "Dune was written by Frank Herbert and published in 1965."),
    (Book, "Good Omens (1990) by Terry Pratchett and Neil Gaiman."),
    (Book, "In 1813 Jane Austen published Pride and Prejudice."),
    (Book, "George Orwell's 1984 came out in 1949."),
    (Book, "Beloved, Toni Morrison, 1987."),
    (Book, "The Hobbit by J. R. R. Tolkien first appeared in 1937."),
    (Meeting, "Budget review on Tuesday with 6 people, held over video call."),
    (Meeting, "The design sync is Friday in room 4B; 3 attendees."),
    (Meeting, "Quarterly planning: Monday, 12 attendees, on Zoom."),
    (Meeting, "Hiring debrief Thursday, 4 interviewers, in the office."),
    (Meeting, "Wednesday's retro has 8 people and runs online."),
    (Meeting, "Launch party on Saturday for 40 guests at the venue."),
]


def extract(
    client: instructor.Instructor, model: str, case: tuple[type[BaseModel], str], **sampling: float
) -> str:
    """One TOOLS-mode call; the validated object's repr (raises on any failure)."""
    response_model, text = case
    result = client.chat.completions.create(
        model=model,
        response_model=response_model,
        max_tokens=128,
        max_retries=0,
        messages=[{"role": "user", "content": f"Extract the {response_model.__name__}: {text}"}],
        **sampling,
    )
    assert isinstance(result, response_model)
    return repr(result)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:30000")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--calls", type=int, default=len(CASES))
    parser.add_argument(
        "--temperature", type=float, help="sent with each call (default: none, the server's 1.0)"
    )
    parser.add_argument("--seed", type=int, help="call i sends seed SEED+i (default: none)")
    args = parser.parse_args()
    raw = openai.OpenAI(base_url=f"{args.base_url}/v1", api_key=args.api_key, max_retries=0)
    client = instructor.from_openai(raw, mode=instructor.Mode.TOOLS)
    ok = 0
    start = time.perf_counter()
    for i in range(args.calls):
        t0 = time.perf_counter()
        try:
            sampling = {} if args.temperature is None else {"temperature": args.temperature}
            if args.seed is not None:
                sampling["seed"] = args.seed + i
            line = extract(client, args.model, CASES[i % len(CASES)], **sampling)
            ok += 1
        except Exception as e:  # a failed call is counted and shown, then the run goes on
            line = f"FAILED {type(e).__name__}: {str(e)[:400]}"
        print(f"{i + 1:3d} {time.perf_counter() - t0:6.2f}s {line}")
    total = time.perf_counter() - start
    print(f"{ok}/{args.calls} validated objects in {total:.1f}s ({total / args.calls:.2f}s a call)")
    return 0 if ok == args.calls else 1


if __name__ == "__main__":
    sys.exit(main())
