"""The scale cases (``conformance/scale.py``) at sizes a test can afford: each compiles and
judges its generated valid and invalid instances right. The full sizes are measured by
``benchmarks/bench_grammar_scale.py``; a 300-deep schema is tested in ``test_workers.py``."""

from __future__ import annotations

import pytest
from grammar_support import shared_compiler
from radixgen.grammar.conformance import scale

CASES = [
    scale.nested(60),
    scale.properties(500),
    scale.any_of(100),
    scale.tree(),
    scale.enum(5000),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("strict", [False, True], ids=["open", "strict"])
def test_scale_case_judges_its_instances(tokenizer, case, strict):
    grammar = shared_compiler(tokenizer).compile_json_schema(case.schema, strict=strict)
    for value in case.valid:
        assert grammar.matcher().accept_string(grammar.canonical_json(value)), value
    for value in case.invalid:
        assert not grammar.matcher().accept_string(grammar.canonical_json(value)), value
