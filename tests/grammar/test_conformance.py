"""Conformance on a fixed sample of MaskBench and JSON-Schema-Test-Suite schemas.

Reads ../shared/data (relative to the repository root) when present. Every compiled
schema must accept each valid instance's canonical text and reject each invalid one's.
The full corpora run in benchmarks/grammar_coverage.py (report: docs/grammar_coverage.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from radixgen.grammar.conformance.corpus import (
    SUITE,
    Case,
    RegexChecker,
    check_case,
    load_corpora,
    render_markdown,
    sample,
    summarize,
)
from radixgen.grammar.json_schema.to_regex import CompiledSchema

DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
SAMPLE_SIZE = 40
CORPORA = load_corpora(DATA_DIR) if DATA_DIR.is_dir() else {}
SAMPLED = [
    (name, case)
    for name, cases in sorted(CORPORA.items())
    for case in sample(cases, SAMPLE_SIZE, seed=1)
]


@pytest.mark.skipif(not CORPORA, reason=f"conformance corpora not found at {DATA_DIR}")
@pytest.mark.parametrize(
    ("corpus", "case"), SAMPLED, ids=[f"{n}:{c.case_id[:60]}" for n, c in SAMPLED]
)
def test_sampled_schema_conforms(corpus: str, case: Case) -> None:
    outcome = check_case(case, RegexChecker())
    assert outcome.status != "crash", outcome.message
    assert not outcome.false_positives, f"accepted invalid instances: {outcome.false_positives[:3]}"
    assert not outcome.false_negatives, f"rejected valid instances: {outcome.false_negatives[:3]}"


class _RecordingChecker:
    """A stand-in for a token-level checker: accepts exactly what the regex does."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def prepare(self, compiled: CompiledSchema):
        inner = RegexChecker().prepare(compiled)

        def accepts(text: str) -> bool:
            self.texts.append(text)
            return inner(text)

        return accepts


def test_checker_is_pluggable() -> None:
    schema = {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
        "additionalProperties": False,
    }
    case = Case(
        "inline",
        schema,
        [({"a": "x", "b": 1}, True, ""), ({"b": "no"}, False, ""), ({"c": 1}, False, "")],
    )
    checker = _RecordingChecker()
    outcome = check_case(case, checker)
    assert outcome.status == "pass"
    assert checker.texts == ['{"b":1,"a":"x"}', '{"b":"no"}', '{"c":1}']


def test_refusal_is_reported_not_failed() -> None:
    case = Case("refused", {"type": "array", "uniqueItems": True}, [([1, 2], True, "")])
    outcome = check_case(case, RegexChecker())
    assert (outcome.status, outcome.refusal) == ("refused", "uniqueItems")


def test_the_report_has_a_row_per_test_suite_file() -> None:
    """docs/grammar_coverage.md shows the JSON-Schema-Test-Suite per keyword file."""
    cases = [
        Case("maxLength/0: a", {"maxLength": 2}, [("ab", True, ""), ("abc", False, "")]),
        Case("maxLength/1: b", {"maxLength": 0}, [("", True, "")]),
        Case("uniqueItems/0: c", {"type": "array", "uniqueItems": True}, [([1], True, "")]),
    ]
    outcomes = [check_case(case, RegexChecker()) for case in cases]
    report = render_markdown([summarize(SUITE, outcomes)], {SUITE: outcomes}, "test")
    assert "per keyword file" in report
    assert "| maxLength | 2 | 2 | 2 | 0 | 0 | 0 |  |" in report
    assert "| uniqueItems | 1 | 0 | 0 | 0 | 0 | 0 | `uniqueItems` 1 |" in report


def test_documented_narrowings_are_told_apart_from_false_negatives() -> None:
    tree = {
        "type": "object",
        "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}},
        "additionalProperties": False,
    }
    deep = {"kids": [{"kids": [{"kids": [{"kids": []}]}]}]}
    case = Case("tree", tree, [(deep, True, ""), ({"kids": [1]}, False, ""), ({"x": 1}, False, "")])
    outcome = check_case(case, RegexChecker(), max_depth=1)
    assert outcome.status == "pass" and len(outcome.narrowed) == 1 and not outcome.false_negatives
    annotation = Case(
        "format", {"format": "email"}, [("not an email", True, "format is an annotation")]
    )
    assert check_case(annotation, RegexChecker()).narrowed == ['"not an email"']


# The corpus schemas whose $refs recurse (found by lowering every schema with
# max_depth=None and keeping those with back references): compiled by GrammarCompiler as
# rules that call themselves, every labelled instance is judged right at any depth.
RECURSIVE = {
    "Github_easy": ["o21858", "o42304", "o58637", "o58839", "o69958", "o78062", "o89710"],
    "Github_trivial": ["o47165"],
    "JSONSchemaTestSuite": [
        "ref/0: root pointer ref",
        "ref/11: Recursive references between schemas",
        "ref/21: simple URN base URI with $ref via the URN",
        "unevaluatedProperties/33: unevaluatedProperties + single cyclic ref",
    ],
}
RECURSIVE_CASES = [
    (corpus, case)
    for corpus, wanted in RECURSIVE.items()
    for case in CORPORA.get(corpus, [])
    if case.case_id.split("---")[-1] in wanted
]


@pytest.mark.skipif(not CORPORA, reason=f"conformance corpora not found at {DATA_DIR}")
def test_recursive_corpus_schemas_conform_at_any_depth(tokenizer) -> None:
    from grammar_support import shared_compiler
    from radixgen.grammar.cfg import CfgGrammar

    assert len(RECURSIVE_CASES) == sum(map(len, RECURSIVE.values()))
    compiler = shared_compiler(tokenizer)
    for corpus, case in RECURSIVE_CASES:
        grammar = compiler.compile_json_schema(case.schema)
        assert isinstance(grammar, CfgGrammar), case.case_id
        for data, valid, description in case.tests:
            m = grammar.matcher()
            text = grammar.canonical_json(data)
            accepted = m.accept_bytes(text.encode()) and m.is_accepting()
            assert accepted == valid, (corpus, case.case_id, description, text[:120])
