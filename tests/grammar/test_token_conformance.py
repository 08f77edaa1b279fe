"""Token-level conformance on a sample of maskbench: the back end agrees with Python ``re``
on the front end's regexes, walking the real tokenizer's ids."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from grammar_support import shared_compiler
from radixgen.grammar.conformance.corpus import RegexChecker, check_case, load_corpora, sample
from radixgen.grammar.conformance.tokens import TokenChecker

DATA = Path(
    os.environ.get("RADIXGEN_SHARED_DATA", Path(__file__).resolve().parents[3] / "shared" / "data")
)
PER_CORPUS = 6


@pytest.fixture(scope="module")
def corpora() -> dict:
    if not (DATA / "maskbench").is_dir():
        pytest.skip(f"maskbench data not found under {DATA}")
    return {
        name: cases for name, cases in load_corpora(DATA).items() if name != "JSONSchemaTestSuite"
    }


def test_token_checker_agrees_with_regex_checker(corpora: dict, tokenizer) -> None:
    """Where the token walk disagrees with a label, Python ``re`` on the same regex must too
    (the front end's narrowing, not the back end). ``re`` is slow on big schemas, so it
    only runs for those."""
    checker = TokenChecker(shared_compiler(tokenizer), tokenizer)
    compiled = passed = 0
    for name, cases in sorted(corpora.items()):
        for case in sample(cases, PER_CORPUS, seed=1):
            by_tokens = check_case(case, checker)
            assert by_tokens.status != "crash", (case.case_id, by_tokens.message)
            compiled += by_tokens.status in ("pass", "fail")
            passed += by_tokens.status == "pass"
            if by_tokens.status == "fail":
                by_regex = check_case(case, RegexChecker())
                assert (by_tokens.false_positives, by_tokens.false_negatives) == (
                    by_regex.false_positives,
                    by_regex.false_negatives,
                ), (name, case.case_id)
    assert compiled >= 20 and passed >= 0.8 * compiled
