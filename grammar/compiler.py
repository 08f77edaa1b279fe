"""GrammarCompiler: JSON Schema / regex / EBNF / choices / any-JSON / structural tags ->
compiled grammar, cached.

Compilation runs in a small thread pool (``compile_async`` returns a ``Future``) so the
engine thread keeps decoding other requests. Each compilation has a wall-clock budget and a
size budget (automaton states, terms) that raise ``GrammarError`` — a runaway grammar fails
that request instead of hanging the server or exhausting memory. The budgets are checked
inside our own loops; time spent in the JSON Schema front end is checked when it returns.

Results are kept in an LRU keyed by (kind, canonical spec, vocabulary fingerprint);
failures are cached too, so resubmitting a bad schema costs a lookup.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from .cfg import CfgGrammar, Grammar, compile_rules, parse_ebnf
from .cfg.from_regex import regex_to_rule
from .cfg.structural_tag import structural_tag_grammar
from .errors import GrammarError, GrammarTooLarge
from .json_schema import to_regex as json_schema
from .json_schema.rules import schema_rules
from .lexer import native as native_lexer
from .lexer.automaton import LazyDFA
from .lexer.regex import has_residues, regex_to_term
from .lexer.terms import Budget, TermStore
from .matcher import CompiledGrammar
from .tokens.table import TokenTable
from .tokens.vocabulary import Vocabulary
from .workers import CompileWorkers, JsonSpec

logger = logging.getLogger(__name__)

DEFAULT_CACHE_BYTES = 512 << 20
EVICT_EVERY = 64  # cache hits between checks of the bytes held (grammars grow in use)
SLOW_COMPILE_S = 0.1  # compiles at least this slow are logged at INFO, the others at DEBUG

KINDS = (  # = SamplingParams' constraint fields
    "json_schema",
    "regex",
    "ebnf",
    "choices",
    "json_object",
    "structural_tag",
)


class GrammarCompiler:
    """Compiles grammars against one tokenizer's vocabulary (thread-safe).

    Args:
        tokenizer_or_vocabulary: a radixgen ``Tokenizer`` or a ``Vocabulary``.
        max_workers: compile threads.
        timeout_s: wall-clock budget of one compilation.
        max_states: automaton states one grammar may reach (at compile or decode time).
        max_terms: regex terms one grammar may build (bounds memory).
        cache_size: compiled grammars (and failures) kept, at most.
        cache_bytes: the memory the kept grammars may hold (their ``nbytes``: masks and
            automata, which grow as requests walk them); past it the least recently used
            go first (the newest stays, however big).
        precompute_s: time each compilation may spend computing token masks ahead of
            decoding, breadth-first from the start state over the likely states (not inside
            undeclared properties or string escapes); the rest are computed on first use.
        isolate: compile in ``max_workers`` worker processes (``workers.py``), not threads:
            a compile then never holds this process's GIL, and one past its budget is
            killed. The engine uses it; tests and scripts may keep the threads.
        native_lexer: regex and JSON Schema grammars step bytes with the C lexer
            (``native_lexer``) where it builds; False keeps the Python reference.
        defer_heavy: with ``isolate``, a heavy grammar (``remote.py``) comes back as a
            ``workers.PickledGrammar``, unpickled only when asked for more than its bytes
            (the engine hands them to its mask worker as they are).
    """

    def __init__(
        self,
        tokenizer_or_vocabulary: Any,
        *,
        max_workers: int = 2,
        timeout_s: float = 10.0,
        max_states: int = 200_000,
        max_terms: int = 4_000_000,
        cache_size: int = 128,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        precompute_s: float = 0.03,
        isolate: bool = False,
        native_lexer: bool = True,
        defer_heavy: bool = False,
    ) -> None:
        vocab = tokenizer_or_vocabulary
        self.vocab = vocab if isinstance(vocab, Vocabulary) else Vocabulary.from_tokenizer(vocab)
        TokenTable.of(self.vocab)  # built once per vocabulary, before the first compile
        self.timeout_s = timeout_s
        self.max_states = max_states
        self.max_terms = max_terms
        self.cache_size = cache_size
        self.cache_bytes = cache_bytes
        self.precompute_s = precompute_s
        self.native_lexer = native_lexer
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grammar")
        self._cache: OrderedDict[tuple[str, str, str], Future] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0
        self._workers: CompileWorkers | None = None
        if isolate:
            settings = {
                "timeout_s": timeout_s,
                "max_states": max_states,
                "max_terms": max_terms,
                "precompute_s": precompute_s,
                "native_lexer": native_lexer,
            }
            self._workers = CompileWorkers(
                self.vocab,
                settings,
                count=max_workers,
                timeout_s=timeout_s,
                defer_heavy=defer_heavy,
            )

    # ------------------------------------------------------------------ public entry points

    def compile_json_schema(
        self,
        schema: dict | str,
        *,
        whitespace: str = "compact",
        max_depth: int | None = None,
        strict: bool = False,
    ) -> CompiledGrammar:
        """Values valid under ``schema`` (see ``json_schema.py`` for the policies)."""
        return self.compile(
            "json_schema", schema, whitespace=whitespace, max_depth=max_depth, strict=strict or None
        )

    def compile_regex(self, pattern: str) -> CompiledGrammar:
        """Strings ``pattern`` matches as a whole (syntax in ``regex.py``)."""
        return self.compile("regex", pattern)

    def compile_ebnf(self, text: str, *, root: str = "root") -> CfgGrammar:
        """Strings the EBNF (GBNF) grammar ``text`` derives from rule ``root`` (syntax in
        ``cfg/ebnf.py``); bad text is a ``GrammarError`` naming line and column."""
        return self.compile("ebnf", text, root=None if root == "root" else root)

    def compile_structural_tag(self, spec: dict | str, *, strict: bool = False) -> CfgGrammar:
        """Free text with tagged, constrained parts (xgrammar's structural tag format, see
        ``structural_tag.py``); ``strict`` closes JSON Schema objects as for schemas."""
        return self.compile("structural_tag", spec, strict=strict or None)

    def compile_choice(self, choices: list[str]) -> CompiledGrammar:
        """Exactly one of ``choices`` (literal strings)."""
        return self.compile("choices", choices)

    def compile_json_object(
        self, *, max_depth: int | None = None, whitespace: str = "compact"
    ) -> CompiledGrammar:
        """Any JSON object (containers nested at most ``max_depth`` deep)."""
        return self.compile("json_object", None, max_depth=max_depth, whitespace=whitespace)

    def compile(self, kind: str, spec: Any = None, **options: Any) -> Any:
        """Compile (or fetch from the cache) and wait; raises ``GrammarError``.

        Waits at most twice the time budget (plus queueing slack): code outside our loops
        (the JSON Schema front end) cannot be interrupted, but it cannot hang the caller."""
        future = self.compile_async(kind, spec, **options)
        try:
            return future.result(timeout=2 * self.timeout_s + 5.0)
        except FutureTimeout:
            raise GrammarError(
                f"grammar: compilation timed out after {self.timeout_s:g} s", source="grammar"
            ) from None

    def compile_async(self, kind: str, spec: Any = None, **options: Any) -> Future:
        """A ``Future[CompiledGrammar]``; the same future for the same key while cached.

        Its exception is a ``GrammarError`` for anything the grammar asks that cannot be
        compiled (bad spec, unsupported feature, over the time or size budget).
        """
        options = {k: v for k, v in options.items() if v is not None}  # None: the default
        try:
            key, spec, wire = self._key(kind, spec, options)
        except GrammarError as err:
            failed: Future = Future()
            failed.set_exception(err)
            return failed
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self.hits += 1
                self._cache.move_to_end(key)
                if self.hits % EVICT_EVERY == 0:
                    self._evict()
                return future
            self.misses += 1
            future = self._pool.submit(self._build, kind, key, spec, options, wire)
            self._cache[key] = future
            self._evict()
        future.add_done_callback(lambda f: self._forget_unexpected(key, f))
        return future

    def cache_info(self) -> dict[str, int]:
        with self._lock:
            return {
                "hits": self.hits,
                "misses": self.misses,
                "size": len(self._cache),
                "bytes": sum(_held_bytes(f) for f in self._cache.values()),
            }

    def _evict(self) -> None:
        """Drop the least recently used grammars past ``cache_size`` entries or
        ``cache_bytes`` held (the newest stays). Called with the lock held, on every miss
        and every ``EVICT_EVERY`` hits: kept grammars grow as requests walk them."""
        cache = self._cache
        while len(cache) > self.cache_size:
            cache.popitem(last=False)
        held = [_held_bytes(f) for f in cache.values()]
        total = sum(held)
        for size in held[:-1]:
            if total <= self.cache_bytes:
                break
            cache.popitem(last=False)
            total -= size

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._workers is not None:
            self._workers.shutdown()

    # ------------------------------------------------------------------ internals

    def _key(
        self, kind: str, spec: Any, options: dict[str, Any]
    ) -> tuple[tuple[str, str, str], Any, Any]:
        """(cache key, validated spec, the spec as the workers' pipe carries it). The key
        keeps the spec's own key order: a schema's property order is its output's."""
        if kind not in KINDS:
            raise GrammarError(
                f"grammar: unknown kind {kind!r}, expected one of {', '.join(KINDS)}",
                source="grammar",
            )
        spec = _validate_spec(kind, spec)
        try:
            spec_text = json.dumps(spec, ensure_ascii=False, separators=(",", ":"))
            text = spec_text + json.dumps(options, sort_keys=True, separators=(",", ":"))
        except (TypeError, ValueError) as err:
            raise GrammarError(
                f"{kind}: spec is not JSON-serializable ({err})", source=kind
            ) from None
        except RecursionError:
            raise GrammarError(f"{kind}: nested too deeply to compile", source=kind) from None
        wire = JsonSpec(spec_text) if isinstance(spec, dict | list) else spec
        return (kind, text, self.vocab.fingerprint), spec, wire

    def _forget_unexpected(self, key: tuple[str, str, str], future: Future) -> None:
        """Keep GrammarError failures cached, but not bugs or cancellations."""
        if future.cancelled() or not isinstance(future.exception(), GrammarError | type(None)):
            with self._lock:
                if self._cache.get(key) is future:
                    del self._cache[key]

    def _build(
        self,
        kind: str,
        key: tuple[str, str, str],
        spec: Any,
        options: dict[str, Any],
        wire: Any = None,
    ) -> CompiledGrammar | CfgGrammar:
        started = time.perf_counter()
        if self._workers is not None:  # the JSON text the key was made of, not dumped again
            grammar = self._workers.run(kind, key, spec if wire is None else wire, options)
        else:
            try:
                grammar = self._build_any(kind, key, spec, options)
            except RecursionError:  # a front end's recursion over a deeply nested spec
                raise GrammarError(f"{kind}: nested too deeply to compile", source=kind) from None
        seconds = time.perf_counter() - started
        logger.log(
            logging.INFO if seconds >= SLOW_COMPILE_S else logging.DEBUG,
            "grammar: %s compiled in %.0f ms%s",
            kind,
            seconds * 1e3,
            "; heavy: its masks are computed in the mask worker"
            if getattr(grammar, "heavy", False)
            else "",
        )
        return grammar

    def _build_any(
        self, kind: str, key: tuple[str, str, str], spec: Any, options: dict[str, Any]
    ) -> CompiledGrammar | CfgGrammar:
        budget = Budget(timeout_s=self.timeout_s, max_terms=self.max_terms)
        if kind in ("ebnf", "structural_tag"):  # grammars written as rules: the Earley engine
            if kind == "ebnf":
                grammar = parse_ebnf(spec, root=options.get("root", "root"))
            else:
                grammar = structural_tag_grammar(
                    spec, strict=options.get("strict", False), budget=budget
                )
            cfg = compile_rules(
                grammar, self.vocab, kind=kind, key=key, max_states=self.max_states, budget=budget
            )
            cfg.warm_up(self.precompute_s)
            return cfg
        try:
            return self._build_regex(kind, key, spec, options, budget)
        except GrammarTooLarge as err:
            if kind != "json_schema":
                raise
            logger.info("%s; compiling the schema as rules instead", err)
            return self._build_schema_rules(key, spec, options, budget)

    def _build_regex(
        self,
        kind: str,
        key: tuple[str, str, str],
        spec: Any,
        options: dict[str, Any],
        budget: Budget,
    ) -> CompiledGrammar:
        regex, canonical, build_term = _front_end(kind, spec, options)
        budget.check()
        # residue atoms (multipleOf beyond a compact regex) are Python terms only
        native = self.native_lexer and native_lexer.available() and not has_residues(regex)
        store_type = native_lexer.NativeTermStore if native else TermStore
        store = store_type(clip_bound=self.vocab.max_token_len + 1, budget=budget)
        try:
            root = build_term(store)  # type: ignore[arg-type]
        except RecursionError:
            raise GrammarError(f"{kind}: nested too deeply to compile", source=kind) from None
        dfa_type = native_lexer.NativeDFA if native else LazyDFA
        dfa = dfa_type(store, root, max_states=self.max_states)  # type: ignore[arg-type]
        grammar = CompiledGrammar(
            kind=kind, key=key, dfa=dfa, vocab=self.vocab, regex=regex, canonical=canonical
        )
        grammar.warm_up(self.precompute_s)
        budget.clear_deadline()
        return grammar

    def _build_schema_rules(
        self, key: tuple[str, str, str], spec: Any, options: dict[str, Any], budget: Budget
    ) -> CfgGrammar:
        """A schema too large for one regex, as rules on the EBNF engine (``json_schema.rules``)."""
        try:
            bodies, node, writer = schema_rules(spec, **options)
            rules = {
                name: regex_to_rule(body, budget, residues=True) for name, body in bodies.items()
            }
        except RecursionError:
            raise GrammarError("json_schema: nested too deeply to compile") from None
        cfg = compile_rules(
            Grammar(rules, "root"),
            self.vocab,
            kind="json_schema",
            key=key,
            max_states=self.max_states,
            budget=budget,
            canonical=functools.partial(_write_canonical, node, writer),
        )
        cfg.warm_up(self.precompute_s)
        budget.clear_deadline()
        return cfg


def _write_canonical(node: Any, writer: Any, instance: Any) -> str:
    return str(node.write(instance, writer))


def _validate_spec(kind: str, spec: Any) -> Any:
    if kind == "json_schema":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as err:
                raise GrammarError(f"json_schema: not valid JSON ({err})") from None
        if not isinstance(spec, dict | bool):
            raise GrammarError(
                f"json_schema: expected an object or a boolean, got {type(spec).__name__}"
            )
    elif kind == "structural_tag":
        if isinstance(spec, str):
            try:
                spec = json.loads(spec)
            except json.JSONDecodeError as err:
                raise GrammarError(f"structural_tag: not valid JSON ({err})", source=kind) from None
        if not isinstance(spec, dict):
            raise GrammarError(
                f"structural_tag: expected an object, got {type(spec).__name__}", source=kind
            )
    elif kind in ("regex", "ebnf") and not isinstance(spec, str):
        raise GrammarError(f"{kind}: expected a string, got {type(spec).__name__}", source=kind)
    elif kind == "choices":
        if (
            not isinstance(spec, list | tuple)
            or not spec
            or not all(isinstance(c, str) for c in spec)
        ):
            raise GrammarError("choices: expected a non-empty list of strings", source="choices")
        spec = list(spec)
    return spec


def _front_end(
    kind: str, spec: Any, options: dict[str, Any]
) -> tuple[str | None, Callable[[Any], str] | None, Callable[[TermStore], int]]:
    """(regex source, canonical_json writer, term builder) for one grammar request."""
    if kind == "choices":
        return None, None, lambda store: store.alt(store.literal(c.encode("utf-8")) for c in spec)
    if kind == "regex":
        return spec, None, lambda store: regex_to_term(spec, store)
    if kind == "json_object":
        regex = json_schema.json_object_regex(**options)
        rare = json_schema.ESCAPE_GROUPS
        return regex, None, lambda store: regex_to_term(regex, store, tag=rare)
    # max_depth None: recursive $refs stay recursive (the regex refuses them as too large,
    # and the schema is compiled as rules)
    lowered = json_schema.compile_schema(spec, **{"max_depth": None, **options})
    return (
        lowered.regex,
        lowered.canonical_json,
        lambda store: regex_to_term(lowered.regex, store, tag=lowered.rare_groups, residues=True),
    )


def _held_bytes(future: Future) -> int:
    """The memory a cached compile holds: its grammar's ``nbytes`` once done (a failure
    or a compile in flight: none counted)."""
    if not future.done() or future.cancelled() or future.exception() is not None:
        return 0
    nbytes = getattr(future.result(), "nbytes", None)
    return int(nbytes()) if callable(nbytes) else 0
