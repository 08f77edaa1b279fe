"""The C lexer (grammar/lexer/native.py, grammar/lexer/csrc/lexer.c) against the Python reference:
same term ids, same walks, same masks on every corpus; pickling; errors; the off switch."""

from __future__ import annotations

import json
import pickle
import random
import re

import numpy as np
import pytest
from grammar_support import synthetic_vocab
from radixgen.grammar.compiler import GrammarCompiler
from radixgen.grammar.conformance.corpus import load_corpora, sample
from radixgen.grammar.errors import GrammarError, GrammarTooLarge
from radixgen.grammar.lexer import native as native_lexer
from radixgen.grammar.lexer.automaton import DEAD, LazyDFA
from radixgen.grammar.lexer.native import NativeDFA, NativeTermStore
from radixgen.grammar.lexer.regex import has_residues, regex_to_term
from radixgen.grammar.lexer.terms import Budget, CompileTimeout, TermStore

pytestmark = pytest.mark.skipif(
    not native_lexer.available(), reason="the native lexer did not build here"
)

PATTERNS = [
    r'\{"name":"[^"\\]{0,20}","age":(0|[1-9][0-9]{0,2})\}',
    r"(ab|a)*c{2,5}[x-z]?",
    r'\[("[a-c]{1,3}"(,"[a-c]{1,3}"){0,4})?\]',
    r"(-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?)|true|false|null",
    r"[\u00e9-\u00ff\u4e00]{1,3}x",
]


def both(pattern: str, **budget) -> list[tuple[object, object]]:
    out = []
    for store_type, dfa_type in ((TermStore, LazyDFA), (NativeTermStore, NativeDFA)):
        store = store_type(clip_bound=17, budget=Budget(**budget))
        out.append((store, dfa_type(store, regex_to_term(pattern, store), max_states=50_000)))
    return out


def random_walk(dfa, rng: random.Random, steps: int) -> list[int]:
    states, s = [], dfa.start
    for _ in range(steps):
        live = [b for b in range(256) if dfa.next_state(s, dfa.class_list[b]) != DEAD]
        if not live:
            break
        s = dfa.next_state(s, dfa.class_list[rng.choice(live)])
        states.append(s)
    return states


@pytest.mark.parametrize("pattern", PATTERNS)
def test_same_terms_states_and_transitions(pattern):
    (py_store, py_dfa), (c_store, c_dfa) = both(pattern)
    assert len(py_store) == len(c_store)
    for seed in range(5):
        assert random_walk(py_dfa, random.Random(seed), 40) == random_walk(
            c_dfa, random.Random(seed), 40
        )
    assert py_dfa.num_states == c_dfa.num_states
    for s in range(py_dfa.num_states):
        t = py_dfa.state_terms[s]
        assert c_dfa.state_terms[s] == t
        assert c_dfa.accepting[s] == py_dfa.accepting[s]
        assert c_store.first_bytes(t) == py_store.first_bytes(t)
        assert c_store.kinds[t] == py_store.kinds[t] and c_store.args[t] == py_store.args[t]
        assert c_store.head_tagged(t) == py_store.head_tagged(t)
        assert c_dfa.mask_key(s) == py_dfa.mask_key(s)
        assert c_dfa.forced_bytes(s) == py_dfa.forced_bytes(s)
    assert c_store.byte_sets() == py_store.byte_sets()


def test_token_walks_match_one_by_one():
    vocab = synthetic_vocab()
    (_, py_dfa), (_, c_dfa) = both(PATTERNS[0])
    from radixgen.grammar.tokens.table import TokenTable

    table = TokenTable.of(vocab)
    ids = np.arange(2, vocab.vocab_size)
    ends = c_dfa.walk_tokens(table, ids, c_dfa.start)
    expected = [py_dfa.walk(py_dfa.start, vocab.token_bytes[i]) for i in ids.tolist()]
    assert ends.tolist() == expected
    later = c_dfa.walk_tokens(table, ids[:50], np.array(ends[:50]), skip=1)  # per-token starts
    assert later.tolist() == [
        py_dfa.walk(e, vocab.token_bytes[i][1:]) if e else DEAD
        for e, i in zip(expected[:50], ids[:50].tolist())
    ]


def test_a_pickled_grammar_walks_on(tokenizer):
    compiler = GrammarCompiler(tokenizer, precompute_s=0.0)
    grammar = compiler.compile_regex(PATTERNS[0])
    assert grammar.dfa.native
    matcher = grammar.matcher()
    assert matcher.accept_string('{"name":"Al')
    copy = pickle.loads(pickle.dumps(grammar))
    copy.attach(compiler.vocab)
    again = copy.matcher()
    assert again.accept_string('{"name":"Al')
    assert np.array_equal(again.current_mask(), matcher.current_mask())
    assert again.accept_string('ice","age":42}') and again.is_accepting()  # new transitions
    assert not again.accept_string("x")


def test_errors_are_grammar_errors():
    with pytest.raises(GrammarTooLarge, match="terms"):
        both("|".join(f"word{i}[ab]" for i in range(3000)), max_terms=1500)  # no trie: a class
    store = NativeTermStore(clip_bound=17, budget=Budget(timeout_s=0.0))
    with pytest.raises(CompileTimeout):
        for i in range(5000):
            store.literal(f"word{i}".encode())
    deep = NativeTermStore(clip_bound=17)
    term = deep.byteset(1 << ord("a"))
    for _ in range(30_000):  # nested far past the C recursion limit: refused, not a crash
        term = deep.rep(deep.cat(term, deep.byteset(1 << ord("b"))), 0, 2)
    dfa = NativeDFA(deep, term, max_states=100)
    with pytest.raises(GrammarError, match="nested too deeply"):
        dfa.walk(dfa.start, b"a")
    store = NativeTermStore(clip_bound=17)
    small = NativeDFA(store, regex_to_term("[0-9]{0,500}", store), max_states=20)
    with pytest.raises(GrammarTooLarge, match="states"):
        small.walk(small.start, b"1" * 30)


def test_the_switch_keeps_the_python_lexer(monkeypatch, tokenizer):
    monkeypatch.setenv("RADIXGEN_NATIVE_GRAMMAR", "0")
    assert not native_lexer.available()
    assert not GrammarCompiler(tokenizer).compile_regex("[ab]+").dfa.native
    assert not GrammarCompiler(tokenizer, native_lexer=False).compile_regex("[ab]+").dfa.native


def _walk_masks(grammar, texts, tokenizer):
    eos = grammar.vocab.eos_token_ids[0]
    out = []
    for text in texts:
        matcher = grammar.matcher()
        for token in [*tokenizer.encode(text), eos]:
            out.append(matcher.current_mask().tobytes())
            out.append(matcher.forced_bytes())
            if not matcher.accept_token(token):
                out.append(b"rejected")
                break
    return out


@pytest.fixture(scope="module")
def corpora(shared_data):
    if not (shared_data / "maskbench").is_dir():
        pytest.skip(f"maskbench data not found under {shared_data}")
    return load_corpora(shared_data)


def test_masks_equal_the_python_lexer_on_every_corpus(corpora, tokenizer):
    """Mask for mask (and forced bytes) along valid and invalid instances, 8 schemas per
    corpus: both lexers computing lazily (so they build their states in the same order), and
    the native one after precomputing every reachable row in C (``NativePrecompute``, rare
    states included)."""
    compilers = [
        GrammarCompiler(tokenizer, precompute_s=0.0, native_lexer=native)
        for native in (False, True)
    ]
    precomputing = GrammarCompiler(tokenizer, precompute_s=0.0, native_lexer=True)
    compared = 0
    for name, cases in sorted(corpora.items()):
        for case in sample(cases, 8, seed=3):
            results = []
            for compiler in [*compilers, precomputing]:
                try:
                    grammar = compiler.compile_json_schema(case.schema)
                except GrammarError as err:
                    results.append(("refused", str(err)))
                    continue
                if compiler is precomputing:
                    assert grammar.index.precompute(30.0, rare=True) > 0
                texts = []
                for data, valid, _ in case.tests:
                    try:
                        texts.append(grammar.canonical_json(data) if valid else json.dumps(data))
                    except Exception:  # noqa: BLE001 - not writable as the grammar writes
                        texts.append(json.dumps(data, separators=(",", ":")))
                results.append(("walked", _walk_masks(grammar, texts, tokenizer)))
            assert results[0] == results[1] == results[2], (name, case.case_id)
            compared += results[0][0] == "walked"
    assert compared >= 40


def test_the_lexicographic_order_the_native_walks_read():
    from radixgen.grammar.tokens.table import TokenTable

    table = TokenTable.of(synthetic_vocab())
    lex = table.lex_by_pair
    assert sorted(lex.ids.tolist()) == sorted(table.ids_by_pair.tolist())
    data = table.token_bytes
    for key in np.flatnonzero(np.diff(table.pair_starts)).tolist():  # same pair slices
        lo, hi = table.pair_starts[key], table.pair_starts[key + 1]
        group = [data[i] for i in lex.ids[lo:hi].tolist()]
        assert group == sorted(group)
        assert set(lex.ids[lo:hi].tolist()) == set(table.ids_by_pair[lo:hi].tolist())
    for k, token in enumerate(lex.ids.tolist()):
        assert lex.buffer[lex.offsets[k] : lex.offsets[k + 1]].tobytes() == data[token]
        assert lex.position[token] == k
        if k:
            a, b = data[lex.ids[k - 1]], data[token]
            common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            assert lex.shared[k] == common


def test_the_c_source_ships_with_the_package():
    tomllib = pytest.importorskip("tomllib")
    from pathlib import Path

    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    patterns = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"][
        "radixgen.grammar.lexer"
    ]
    grammar_dir = Path(native_lexer.__file__).parent
    shipped = {path.name for pattern in patterns for path in grammar_dir.glob(pattern)}
    assert set(native_lexer.SOURCES) == {p.name for p in (grammar_dir / "csrc").iterdir()}
    assert set(native_lexer.SOURCES) <= shipped


def test_a_store_is_freed_with_its_last_reference():
    """No reference cycle: the C memory goes when the grammar does, not at the next collection."""
    import gc
    import weakref

    gc.disable()
    try:
        store = NativeTermStore(clip_bound=17)
        dfa = NativeDFA(store, regex_to_term(PATTERNS[0], store), max_states=1000)
        assert dfa.walk(dfa.start, b'{"name":"x') != DEAD and store.kinds[2] is not None
        copy = pickle.loads(pickle.dumps(dfa))
        refs = [weakref.ref(x) for x in (store, dfa, copy, copy.store)]
        del store, dfa, copy
        assert [r() for r in refs] == [None] * 4
    finally:
        gc.enable()


def test_big_literal_alternations_build_the_same_trie_in_c():
    """``rg_trie`` makes the terms of the Python ``_trie`` in the same order (same ids)."""
    rng = random.Random(5)
    words = {"", "a", "ab", "abc"} | {
        "".join(rng.choice('abé"-') for _ in range(rng.randint(1, 7))) for _ in range(500)
    }
    pattern = "(?:" + "|".join(re.escape(w) for w in words) + ")x"
    (py_store, py_dfa), (c_store, c_dfa) = both(pattern)
    assert py_dfa.state_terms[py_dfa.start] == c_dfa.state_terms[c_dfa.start]
    for word in list(words)[:100]:
        for dfa in (py_dfa, c_dfa):
            end = dfa.walk(dfa.start, (word + "x").encode())
            assert end != DEAD and dfa.accepting[end]


def test_group_and_class_spans_match_the_python_scan():
    """``rg_spans`` finds the spans ``regex._group_and_class_spans`` finds, on fuzzed
    patterns full of escapes, unclosed and leading-']' classes, stray parentheses and
    non-ASCII characters."""
    from radixgen.grammar.lexer.regex import _group_and_class_spans

    store = NativeTermStore(clip_bound=17, budget=Budget())
    rng = random.Random(11)
    patterns = ["", "\\", "[", "[]", "[^]", "[]]", "[^]]x]", "(()", "())", "[\\]]", "a\\"]
    patterns += [
        "".join(rng.choice("\\[]()^aé") for _ in range(rng.randint(1, 30))) for _ in range(3000)
    ]
    for pattern in patterns:
        assert store.spans(pattern) == _group_and_class_spans(pattern), pattern
    assert store.spans("(\ud800)") is None  # a lone surrogate: the Python scan does it


def test_group_and_class_spans_match_on_the_corpora(corpora):
    from radixgen.grammar.json_schema.to_regex import schema_to_regex
    from radixgen.grammar.lexer.regex import _group_and_class_spans

    store = NativeTermStore(clip_bound=17, budget=Budget())
    checked = 0
    for cases in corpora.values():
        for case in sample(cases, 6, seed=2):
            try:
                pattern = schema_to_regex(case.schema)
            except GrammarError:
                continue
            assert store.spans(pattern) == _group_and_class_spans(pattern)
            checked += 1
    assert checked >= 20


def test_character_classes_build_the_same_terms_in_c():
    """``rg_byte_sequences`` (a class in one call) makes the terms of the Python reference
    in the same order: ASCII, 2-, 3- and 4-byte ranges, surrogates cut out, complements."""
    from radixgen.grammar.lexer.regex import ranges_to_term
    from radixgen.grammar.lexer.utf8 import complement

    rng = random.Random(7)
    classes = [[(0x41, 0x5A)], [(0x22, 0x22)], complement([(0x22, 0x22), (0x5C, 0x5C)])]
    classes += [[(0xD000, 0xE100)], [(0x80, 0x10FFFF)], complement([(0x0A, 0x0A)])]
    for _ in range(40):
        lo = rng.randint(0, 0x10FFFF)
        classes.append([(lo, min(0x10FFFF, lo + rng.choice([0, 5, 300, 70000])))])
    py = TermStore(clip_bound=17, budget=Budget())
    c = NativeTermStore(clip_bound=17, budget=Budget())
    for ranges in classes:
        assert ranges_to_term(ranges, py) == ranges_to_term(ranges, c)
    assert len(py) == len(c)


def _corpus_stores(corpora, per_corpus: int):
    """Native stores of corpus schemas' regexes, walked a little (so derivatives exist)."""
    from radixgen.grammar.json_schema.to_regex import compile_schema

    for cases in corpora.values():
        for case in sample(cases, per_corpus, seed=5):
            try:
                lowered = compile_schema(case.schema, max_depth=None)
                store = NativeTermStore(clip_bound=40, budget=Budget())
                root = regex_to_term(lowered.regex, store, tag=lowered.rare_groups)
            except GrammarError:
                continue
            dfa = NativeDFA(store, root, max_states=50_000)
            random_walk(dfa, random.Random(1), 30)
            yield store


def test_safe_runs_in_c_equal_the_python_analysis_on_the_corpora(corpora):
    """``rg_safe_run`` against ``SafeRuns._run`` (the reference) for every term."""
    from radixgen.grammar.tokens.safe_runs import SafeRuns

    compared = 0
    for store in _corpus_stores(corpora, 10):
        in_c, in_python = SafeRuns(store), SafeRuns(store, native=False)
        for t in range(len(store)):
            assert in_c(t) == in_python(t), t
            compared += 1
    assert compared > 10_000
    # the UTF-8 bit: a string's content admits any non-ASCII character
    store = NativeTermStore(clip_bound=17, budget=Budget())
    root = regex_to_term(r'[^"\\]{0,30}"', store)
    assert SafeRuns(store)(root) == SafeRuns(store, native=False)(root)
    assert SafeRuns(store)(root)[1] >> 256 == 1


def test_byte_classes_in_c_equal_the_python_partition():
    from radixgen.grammar.lexer.automaton import byte_classes

    rng = random.Random(11)
    for _ in range(200):
        store = NativeTermStore(clip_bound=17, budget=Budget())
        for _ in range(rng.randint(0, 300)):
            mask = 0
            for _ in range(rng.choice([1, 2, 5, 40, 200, 250])):
                mask |= 1 << rng.randrange(256)
            store.byteset(mask)
        classes, reps = store.byte_classes()
        expected, expected_reps = byte_classes(store.byte_sets())
        assert classes.tolist() == expected.tolist() and reps == expected_reps


def _parse_both(pattern: str, tag: frozenset[str] = frozenset()) -> tuple[object, object]:
    """(the Python parser's outcome, the C parser's) on fresh stores: ("ok", root, store
    size), ("error", message), or for C ("bail",): it leaves the pattern to Python."""
    from radixgen.grammar.lexer.regex import _Parser

    py = TermStore(clip_bound=17, budget=Budget())
    try:
        expected: object = ("ok", _Parser(pattern, py, tag=tag).parse(), len(py))
    except GrammarError as err:
        expected = ("error", str(err))
    c = NativeTermStore(clip_bound=17, budget=Budget())
    term = c.parse_regex(pattern, tag)
    return expected, ("bail",) if term is None else ("ok", term, len(c))


def test_the_c_parser_makes_the_python_parsers_terms_on_fuzzed_patterns():
    """Same root, same store size (so the same terms in the same order), or a bail to the
    Python parser; never a pattern Python refuses."""
    rng = random.Random(5)
    alphabet = list('ab|()[]^-$*+?{},.\\dDwWsSnt0x1u9:P<>=!&_ é"')
    alphabet += [r"\x41", r"\u00e9", "{2}", "{1,3}", "{,2}", "{2,}", "[^a]", "(?:", "(?P<n>"]
    alphabet += [r"\.", r"\|", "aaaaa"]
    parsed = 0
    for _ in range(6000):
        pattern = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 25)))
        expected, got = _parse_both(pattern)
        assert got == ("bail",) or got == expected, pattern
        parsed += got != ("bail",)
    words = [f"w{i}" for i in range(70)] + [r"a\|b", r"a\.b", "é", r"a\\b", ""]
    for _ in range(300):  # big alternations of literals: the trie paths
        body = "|".join(rng.sample(words, rng.randint(1, 75)))
        pattern = rng.choice(["(%s)", "%s", "(?:%s)x", "a(%s)*"]) % body + rng.choice(["", "$"])
        expected, got = _parse_both(pattern)
        assert got == expected, pattern
    assert parsed > 1500


def test_the_c_parser_makes_the_python_parsers_terms_on_the_corpora(corpora):
    from radixgen.grammar.json_schema.to_regex import compile_schema

    compared = 0
    for cases in corpora.values():
        for case in sample(cases, 25, seed=4):
            try:
                lowered = compile_schema(case.schema, max_depth=None)
            except GrammarError:
                continue
            if has_residues(lowered.regex):  # Python terms only (lexer/residues.py)
                continue
            expected, got = _parse_both(lowered.regex, frozenset(lowered.rare_groups))
            assert got == expected, case.case_id
            compared += 1
    assert compared >= 100
