"""Conformance of compiled JSON Schemas against labelled instances.

For every schema of a corpus: compile it; write each instance with the grammar's own
writer (`CompiledSchema.canonical_json`); a valid instance's text must be accepted, an
invalid one's rejected. A refusal (GrammarError) is not a failure, only lost coverage.

Corpora: MaskBench (``{id, schema, tests: [{valid, data}]}`` per JSONL line) and the
JSON-Schema-Test-Suite (per file, a list of ``{description, schema, tests}``). Labels are
the corpus's; `label_check` cross-checks them with the `jsonschema` package when it is
installed (it skips formats whose checkers need extra packages, so disagreements are
reported, not trusted).

The checker is pluggable: anything with ``prepare(compiled) -> (text -> bool)``.
`RegexChecker` uses Python `re` on the regex; a token-level checker can walk a matcher.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ..errors import GrammarError
from ..json_schema.to_regex import (
    DEFAULT_MAX_DEPTH,
    CompiledSchema,
    build_schema_ir,
    compile_schema,
)
from ..lexer.native import regex_matcher
from ..lexer.regex import has_residues

DEPTH_PROBE = 4  # extra nesting levels tried when checking whether the bound explains a rejection


@dataclass
class Case:
    """One schema and its labelled instances: (data, valid, description)."""

    case_id: str
    schema: dict | bool
    tests: list[tuple[object, bool, str]]


@dataclass
class Outcome:
    case_id: str
    status: str  # "pass" | "fail" | "refused" | "crash"
    refusal: str | None = None  # refused keyword (or "other")
    message: str = ""
    false_positives: list[str] = field(default_factory=list)  # texts of invalid instances accepted
    false_negatives: list[str] = field(default_factory=list)  # texts of valid instances rejected
    narrowed: list[str] = field(default_factory=list)  # valid, rejected by a documented narrowing
    label_disagreements: int = 0
    num_tests: int = 0
    seconds: float = 0.0


class Checker(Protocol):
    def prepare(self, compiled: CompiledSchema) -> Callable[[str], bool]: ...


class RegexChecker:
    """String-level check: Python `re.fullmatch` on the schema's regex (which `re` cannot
    read where it holds residue atoms: our Python lexer, then)."""

    def prepare(self, compiled: CompiledSchema) -> Callable[[str], bool]:
        if has_residues(compiled.regex):
            return regex_matcher(compiled.regex)
        pattern = re.compile(compiled.regex)
        return lambda text: pattern.fullmatch(text) is not None


# ---------------------------------------------------------------- corpora


def load_maskbench(path: Path) -> list[Case]:
    cases = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            tests = [
                (t["data"], bool(t["valid"]), t.get("description", "")) for t in record["tests"]
            ]
            cases.append(Case(record["id"], record["schema"], tests))
    return cases


SUITE = "JSONSchemaTestSuite"  # the corpus name of the JSON-Schema-Test-Suite


def load_test_suite(directory: Path) -> list[Case]:
    cases = []
    for path in sorted(directory.glob("*.json")):
        for index, group in enumerate(json.loads(path.read_text(encoding="utf-8"))):
            tests = [(t["data"], bool(t["valid"]), t["description"]) for t in group["tests"]]
            cases.append(
                Case(f"{path.stem}/{index}: {group['description']}", group["schema"], tests)
            )
    return cases


def load_corpora(data_dir: Path) -> dict[str, list[Case]]:
    """Every corpus found under `data_dir` (MaskBench files and the test suite)."""
    corpora = {}
    for path in sorted((data_dir / "maskbench").glob("*.jsonl")):
        corpora[path.stem] = load_maskbench(path)
    suite = data_dir / "json-schema-test-suite" / "draft2020-12"
    if suite.is_dir():
        corpora[SUITE] = load_test_suite(suite)
    return corpora


def sample(cases: list[Case], count: int, seed: int = 0) -> list[Case]:
    """A fixed, seeded sample (in corpus order)."""
    if len(cases) <= count:
        return list(cases)
    chosen = sorted(random.Random(seed).sample(range(len(cases)), count))
    return [cases[i] for i in chosen]


# ---------------------------------------------------------------- checking


def label_check(schema: object, tests: Iterable[tuple[object, bool, str]]) -> int:
    """How many labels the `jsonschema` package disagrees with (0 if unavailable)."""
    try:
        import jsonschema
        from jsonschema.validators import validator_for
    except ImportError:
        return 0
    try:
        cls = validator_for(schema, default=jsonschema.Draft202012Validator)
        validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
        return sum(validator.is_valid(data) != valid for data, valid, _ in tests)
    except Exception:  # unresolvable refs, invalid schemas: the corpus label stands
        return 0


def check_case(
    case: Case, checker: Checker, *, max_depth: int = DEFAULT_MAX_DEPTH, whitespace: str = "compact"
) -> Outcome:
    """Compile one schema and check every labelled instance."""
    start = time.perf_counter()
    outcome = Outcome(case.case_id, "pass", num_tests=len(case.tests))
    try:
        compiled = compile_schema(case.schema, whitespace=whitespace, max_depth=max_depth)
        accepts = checker.prepare(compiled)
    except GrammarError as exc:
        outcome.status, outcome.refusal, outcome.message = "refused", _refusal_kind(exc), str(exc)
    except Exception as exc:  # a bug: reported, never hidden
        outcome.status, outcome.message = "crash", f"{type(exc).__name__}: {exc}"
    else:
        for data, valid, _ in case.tests:
            text = compiled.canonical_json(data)
            if accepts(text) == valid:
                continue
            if valid and _narrowing_explains(case.schema, data, max_depth):
                outcome.narrowed.append(text)
                continue
            (outcome.false_negatives if valid else outcome.false_positives).append(text)
        if outcome.false_positives or outcome.false_negatives:
            outcome.status = "fail"
    outcome.label_disagreements = label_check(case.schema, case.tests)
    outcome.seconds = time.perf_counter() - start
    return outcome


def _refusal_kind(exc: GrammarError) -> str:
    """The refused keyword, or why a schema without one was refused."""
    if exc.keyword:
        return exc.keyword
    message = str(exc)
    if "accepts no value" in message:
        return "(unsatisfiable)"
    if "too large" in message or "too many" in message:
        return "(size)"
    return "(other)"


def _narrowing_explains(schema: object, data: object, max_depth: int) -> bool:
    """Whether a valid instance is rejected only by a documented narrowing: nesting beyond
    `max_depth`, a `format` asserted (the draft may make it an annotation, and formats are
    narrower than validators), or a `pattern` narrowed to fit minLength/maxLength. Probes
    the IR (not the regex) with deeper bounds and those narrowings off."""
    for extra in range(1, DEPTH_PROBE + 1):
        try:
            node, ctx = build_schema_ir(schema, max_depth=max_depth + extra, assert_formats=False)
        except GrammarError:
            return False
        if node.admits(data, ctx, depth_bound=False):
            return True
    return False


def run_corpus(
    cases: Iterable[Case],
    checker: Checker | None = None,
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    whitespace: str = "compact",
) -> list[Outcome]:
    checker = checker or RegexChecker()
    return [check_case(c, checker, max_depth=max_depth, whitespace=whitespace) for c in cases]


@dataclass
class Summary:
    name: str
    num_schemas: int
    num_compiled: int
    num_passing: int  # no false positive or negative (documented narrowings allowed)
    num_passing_all_valid: int  # and every valid instance accepted
    num_false_positives: int
    num_false_negatives: int
    num_narrowed: int
    num_crashes: int
    num_label_disagreements: int
    refusals: Counter
    seconds: float

    @property
    def pass_rate(self) -> float:
        return self.num_passing / self.num_schemas if self.num_schemas else 0.0


def summarize(name: str, outcomes: list[Outcome]) -> Summary:
    return Summary(
        name=name,
        num_schemas=len(outcomes),
        num_compiled=sum(o.status in ("pass", "fail") for o in outcomes),
        num_passing=sum(o.status == "pass" for o in outcomes),
        num_passing_all_valid=sum(o.status == "pass" and not o.narrowed for o in outcomes),
        num_false_positives=sum(len(o.false_positives) for o in outcomes),
        num_false_negatives=sum(len(o.false_negatives) for o in outcomes),
        num_narrowed=sum(len(o.narrowed) for o in outcomes),
        num_crashes=sum(o.status == "crash" for o in outcomes),
        num_label_disagreements=sum(o.label_disagreements for o in outcomes),
        refusals=Counter(o.refusal for o in outcomes if o.status == "refused"),
        seconds=sum(o.seconds for o in outcomes),
    )


def render_suite_files(outcomes: list[Outcome]) -> list[str]:
    """The test suite's rows per keyword file (a case id is ``file/index: description``)."""
    files: dict[str, list[Outcome]] = {}
    for o in outcomes:
        files.setdefault(o.case_id.split("/", 1)[0], []).append(o)
    lines = [
        f"## {SUITE} (draft 2020-12), per keyword file",
        "",
        "A row per file of the suite; a schema is one test group. *refused*: the keywords refused.",
        "",
        "| file | schemas | compiled | passing | false pos. | false neg. | narrowed | refused |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, outs in sorted(files.items()):
        s = summarize(name, outs)
        refused = ", ".join(f"`{k}` {n}" for k, n in s.refusals.most_common())
        lines.append(
            f"| {name} | {s.num_schemas} | {s.num_compiled} | {s.num_passing} | "
            f"{s.num_false_positives} | {s.num_false_negatives} | {s.num_narrowed} | {refused} |"
        )
    return lines


def render_markdown(
    summaries: list[Summary], outcomes: dict[str, list[Outcome]], options: str
) -> str:
    """The coverage report: one row per corpus, refusals by keyword, every failure."""
    lines = [
        "# JSON Schema grammar coverage",
        "",
        "Generated by `python benchmarks/grammar_coverage.py` "
        f"({options}). A schema *passes* when it compiles and every labelled instance, written",
        "by the grammar's canonical writer, is accepted if valid and rejected if invalid.",
        "Refusals (GrammarError) lose coverage but are never wrong; false positives/negatives are.",
        "A valid instance rejected only by a documented narrowing (nesting deeper than `max_depth`",
        "in free-form values or recursive `$ref`s; `format` asserted, also where the draft makes it",
        "an annotation; `pattern` narrowed to fit minLength/maxLength) is counted under *narrowed*,",
        "not as a false negative; *all valid accepted* counts the passing schemas without any.",
        "",
        "| corpus | schemas | compiled | passing | pass rate | all valid accepted | false pos. | false neg. | narrowed | crashes | label disagreements* | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in summaries:
        lines.append(
            f"| {s.name} | {s.num_schemas} | {s.num_compiled} | {s.num_passing} | {s.pass_rate:.1%} | {s.num_passing_all_valid} | "
            f"{s.num_false_positives} | {s.num_false_negatives} | {s.num_narrowed} | {s.num_crashes} | "
            f"{s.num_label_disagreements} | {s.seconds:.0f} |"
        )
    lines += [
        "",
        "\\* instances whose corpus label the `jsonschema` package (with its format checker, minus",
        "formats that need optional packages) disputes; the corpus label is used.",
        "",
        "## Policies (see `grammar/json_schema/` and its module docstrings)",
        "",
        "- Exact or narrower, never wider; anything else is refused with GrammarError naming the",
        "  keyword and JSON pointer. `(unsatisfiable)`: the schema admits no value at all.",
        "- Extra properties follow JSON Schema (allowed unless `additionalProperties: false`);",
        "  `strict=True` leaves them out. Properties are written in the schema's order.",
        "- `format` is asserted (date, time, date-time, email, hostname, ipv4, ipv6, uri, uuid,",
        "  json-pointer, relative-json-pointer, duration); unknown formats are annotations.",
        "- Numbers compare as the doubles validators parse; bounded numbers have no exponent.",
        "- multipleOf: any integer or decimal step, and `not: {multipleOf}`, exactly, on the",
        "  rationals the JSON texts write (0.01 is 1/100, not the double nearest it; validators",
        "  dividing doubles reject 0.07 for it). Compact cases stay regexes (a range's multiples",
        "  listed, last digits for k dividing 1000, small remainder automata); the rest is a",
        "  residue atom (`lexer/residues.py`), with the range's regex stepped beside it. Such",
        "  numbers have no exponent. Refused: steps whose common multiple, scaled by their",
        "  decimals, passes 100,000, or more than 12 decimals.",
        "- oneOf compiles when its branches are provably disjoint, object branches can be made",
        "  exclusive through their required properties, or else as `Bi and not Bj` for the other",
        "  overlapping branches (where each has an exact complement); anyOf drops branches another",
        "  covers.",
        "- if/then/else and dependentSchemas: `(rest and if and then) | (rest and not-if and else)`,",
        "  with not-if written as schemas (types, enum/const of scalars, bounds, lengths and counts,",
        "  required, properties, items, contains, multipleOf, pattern, propertyNames excluding",
        "  finitely many names or a lone pattern, additionalProperties, patternProperties, not,",
        "  anyOf, oneOf); other conditions are refused. The complements of additionalProperties,",
        "  patternProperties and propertyNames ask for some member whose name is in a class and",
        "  whose value is in a schema: a listed property, or an extra member of the class (up",
        "  to 4 such conditions per object, one member may meet several; with counted extras the",
        "  ways to place them are bounded).",
        "- A pattern a `not` excludes, and allOf patterns past 256 states, are exact differences",
        "  of canonical encodings (`TermStore.diff`), explored up to 30,000 pairs per grammar.",
        "- contains/minContains/maxContains: each item is a hit (`contains`) or a miss (its",
        "  complement) and the regex counts hits; refused with prefixItems, and with maxItems or a",
        "  minItems above minContains where minContains/maxContains are given. Without them, and",
        "  for up to 4 `contains` at once (allOf), an item meeting each is placed among counted",
        "  items (one item may meet several).",
        "- uniqueItems: where items take finitely many values (booleans, null, enums), as the list",
        "  of every distinct-item array (at most 4,096); refused otherwise.",
        "- propertyNames: finitely many names become listed properties; name regexes restrict extra",
        "  names (listed names subtracted from length ranges and from a lone `pattern`; refused",
        "  where another pattern-like name schema also admits a listed name).",
        "- patternProperties: extra names are split by exactly which patterns (up to 6) match them,",
        "  listed names subtracted, propertyNames (lengths, a lone pattern, names) intersected;",
        "  such names keep to characters every regex engine reads alike",
        "  (the BMP; printable ASCII where a pattern uses `.` or a class escape; no newline with `$`).",
        "  Under allOf each side's patterns and additionalProperties bind every unlisted name; at",
        "  most 32 names allowed in all become listed properties (a closed object).",
        "- minProperties/maxProperties with extra properties allowed: one variant per set of",
        "  optional listed properties present (at most 12 of them, 256 variants), each counting",
        "  its extra members.",
        "",
        "## Refusals by keyword",
        "",
    ]
    for s in summaries:
        refusals = ", ".join(f"`{k}` {n}" for k, n in s.refusals.most_common()) or "none"
        lines.append(f"- **{s.name}**: {refusals}")
    suite = outcomes.get(SUITE)
    if suite:
        lines += ["", *render_suite_files(suite)]
    failures = [
        (name, o) for name, outs in outcomes.items() for o in outs if o.status in ("fail", "crash")
    ]
    lines += ["", "## Failures", ""]
    if not failures:
        lines.append("None.")
    for name, o in failures:
        detail = (
            o.message
            or f"{len(o.false_positives)} false positives, {len(o.false_negatives)} false negatives"
        )
        lines.append(f"- {name} `{o.case_id}`: {o.status}: {detail}")
    return "\n".join(lines) + "\n"
