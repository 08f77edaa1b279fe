"""Per-type lowering of a flattened schema dict into IR nodes.

Each `lower_<type>` reads only the keywords of its type and raises GrammarError for any it
cannot honor exactly. Keywords honored only in special cases:

* multipleOf: any integer or decimal step, with `not: {multipleOf}` (`_not_multipleOf`),
  exactly, on the rationals the JSON texts write. A compact regex where there is one
  (`numbers.multiple_regex`: a bounded range's multiples, k dividing 1000 by the last digits,
  a small remainder automaton); else a residue atom (`lexer/residues.py`), with the range's
  regex stepped beside it where the bounds are not at 0.
* uniqueItems: when at most one item is possible, or items take finitely many values
  (`unique`).
* contains / minContains / maxContains: `contains`.

Objects are lowered in `objects`.
"""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from ..errors import GrammarError
from ..lexer.regex_builders import alt, repeat
from ..lexer.residues import DIFF_ATOM, ResidueSpec
from .contains import lower_contains
from .formats import format_pattern
from .ir import Array, Boolean, Integer, Never, Node, Null, Number, String
from .lengths import pattern_regex
from .lowering import Lowering
from .name_sets import NameSetError, patterns_regex
from .numbers import (
    EXCLUSIVE_ZERO_EPSILON,
    NUMBER,
    Bound,
    integer_range_regex,
    multiple_regex,
    number_range_regex,
)
from .objects import lower_object, non_negative_int
from .pattern import PatternError
from .strings import any_json_char_regex, string_regex
from .unique import at_most_one_item, unique_array

_REFUSED = frozenset({"unevaluatedProperties", "unevaluatedItems"})
_FLOAT_EXACT_LIMIT = 2**53


class TypeLowering:
    def __init__(self, builder: Lowering) -> None:
        self.builder = builder

    def check(self, key: str, s: dict, pointer: str) -> None:
        """Refuse keywords never honored for their type."""
        if key in _REFUSED or (key == "dependentSchemas" and s[key]):
            raise GrammarError(keyword=key, pointer=pointer)

    def lower(self, kind: str, s: dict, pointer: str, base: str) -> Node:
        if kind == "object":
            return lower_object(self.builder, s, pointer, base)
        if kind == "null":
            return Null()
        if kind == "boolean":
            return Boolean()
        if kind == "number":
            declared = s.get("type")
            declared = {declared} if isinstance(declared, str) else set(declared or ())
            return self.lower_number(
                s, pointer, integer="integer" in declared and "number" not in declared
            )
        return getattr(self, f"lower_{kind}")(s, pointer, base)

    # ------------------------------------------------------------ strings

    def lower_string(self, s: dict, pointer: str, base: str) -> Node:
        node = self._lower_string(s, pointer, base)
        excluded = s.get("_not_patterns")
        if not excluded or not isinstance(node, String):
            return node
        # strings no excluded pattern finds: the body minus theirs (`TermStore.diff`), both
        # over canonical encodings, so that one string has one text on either side
        body = node.body if not node.unconstrained else _canonical_body(node)
        try:
            others = alt([pattern_regex(p, 0, None) for p in map(_pattern_text, excluded)])
        except PatternError as exc:
            raise GrammarError(keyword="not", pointer=pointer, detail=str(exc)) from None
        if others is None:
            return node
        return String(f"{DIFF_ATOM}({body})({others})", False, node.min_len, node.max_len)

    def _lower_string(self, s: dict, pointer: str, base: str) -> Node:
        min_len = non_negative_int(s, "minLength", pointer, 0)
        max_len = non_negative_int(s, "maxLength", pointer, None)
        pattern, keyword = s.get("pattern"), "pattern"
        fmt = s.get("format")
        if isinstance(fmt, str) and self.builder.assert_formats:
            try:
                fmt_pattern = format_pattern(fmt)
            except KeyError:
                raise GrammarError(
                    keyword="format", pointer=pointer, detail=f"format {fmt!r}"
                ) from None
            if fmt_pattern is not None:
                if pattern is not None:
                    raise GrammarError(
                        keyword="format", pointer=pointer, detail="format together with pattern"
                    )
                pattern, keyword = fmt_pattern, "format"
        if pattern is None:
            body = string_regex(min_len, max_len)
            return Never() if body is None else String(body[1:-1], True, min_len, max_len)
        if not isinstance(pattern, str):
            raise GrammarError(keyword="pattern", pointer=pointer, detail="expected a string")
        if s.get("_patterns"):  # allOf asked several patterns of this string: all must match
            patterns = [pattern, *s["_patterns"]]
            try:
                body = patterns_regex(patterns, min_len, max_len)
            except PatternError as exc:
                raise GrammarError(keyword="pattern", pointer=pointer, detail=str(exc)) from None
            except (NameSetError, RecursionError):  # past the explicit intersection's size
                body = _patterns_by_difference(patterns, min_len, max_len, pointer)
            return Never() if body is None else String(body, False, min_len, max_len)
        if not self.builder.assert_formats:  # a conformance probe: no narrowing of lengths
            min_len, max_len = 0, None
        try:
            body = pattern_regex(pattern, min_len, max_len)
        except PatternError as exc:
            raise GrammarError(keyword=keyword, pointer=pointer, detail=str(exc)) from None
        return Never() if body is None else String(body, False, min_len, max_len)

    # ------------------------------------------------------------ numbers

    def lower_number(self, s: dict, pointer: str, *, integer: bool) -> Node:
        if s.get("_not_multipleOf"):
            return self._residue_number(s, pointer, integer=integer)
        step = s.get("multipleOf")
        multiple: int | None = None  # an integer step >= 2: only its multiples
        number_as_integer = False  # a `number` whose step makes it an integer: 2.0 is "2"
        if step is not None:
            step_value = _decimal(step, "multipleOf", pointer)
            if step_value <= 0:
                raise GrammarError(
                    keyword="multipleOf", pointer=pointer, detail="expected a positive number"
                )
            if step_value >= 2 and step_value == step_value.to_integral_value():
                multiple, number_as_integer, integer = int(step_value), not integer, True
            else:
                if Decimal(1) % step_value == 0 and not integer and step_value == 1:
                    number_as_integer = integer = True
                if not integer or Decimal(1) % step_value != 0:
                    return self._residue_number(s, pointer, integer=integer)
        lo = self._bound(s, "minimum", "exclusiveMinimum", pointer, upper=False)
        hi = self._bound(s, "maximum", "exclusiveMaximum", pointer, upper=True)
        if integer:
            lo_int, hi_int = _integer_bounds(lo, hi)
            if multiple is None:
                regex = integer_range_regex(lo_int, hi_int)
            else:
                try:
                    regex = multiple_regex(multiple, lo_int, hi_int)
                except ValueError:  # no compact regex: the residues' automaton
                    return self._residue_number(s, pointer, integer=not number_as_integer)
            bounds = [None if b is None else Bound(Decimal(b), False) for b in (lo_int, hi_int)]
            return (
                Never()
                if regex is None
                else Integer(
                    regex, bounds[0], bounds[1], self.builder.draft > 4 or number_as_integer
                )
            )
        safe_lo, safe_hi = (
            self._float_safe(lo, pointer, upper=False),
            self._float_safe(hi, pointer, upper=True),
        )
        regex = NUMBER if lo is None and hi is None else number_range_regex(safe_lo, safe_hi)
        return Never() if regex is None else Number(regex, lo, hi)

    def _residue_number(self, s: dict, pointer: str, *, integer: bool) -> Node:
        """A number under steps no compact regex writes: ``multipleOf`` of any integer or
        decimal step and ``not: {multipleOf}`` (``_not_multipleOf``), exactly, as one residue
        atom (``lexer/residues.py``). Bounds: a sign where they sit at 0, else the range's
        regex inside the atom; a bounded integer range of at most 4,096 members is their list."""
        step = s.get("multipleOf")
        musts = [] if step is None else [_fraction(step, "multipleOf", pointer)]
        nots = [_fraction(v, "multipleOf", pointer) for v in s.get("_not_multipleOf", [])]
        if integer:  # an integer is a multiple of p/q (lowest terms) exactly when of p
            musts = [Fraction(f.numerator) for f in musts]
            nots = [Fraction(f.numerator) for f in nots]
        if any(f == 1 for f in nots) and integer:
            return Never()  # every integer is a multiple of 1
        lo = self._bound(s, "minimum", "exclusiveMinimum", pointer, upper=False)
        hi = self._bound(s, "maximum", "exclusiveMaximum", pointer, upper=True)

        def takes(x: Fraction) -> bool:
            return all((x / f).denominator == 1 for f in musts) and not any(
                (x / f).denominator == 1 for f in nots
            )

        float_is_integer = self.builder.draft > 4
        if integer and lo is not None and hi is not None:
            lo_int, hi_int = _integer_bounds(lo, hi)
            assert lo_int is not None and hi_int is not None
            if hi_int - lo_int < _MAX_SCANNED:
                members = [v for v in range(lo_int, hi_int + 1) if takes(Fraction(v))]
                if len(members) <= _MAX_LISTED:
                    regex = alt([str(v) for v in members])
                    bounds = (Bound(Decimal(lo_int), False), Bound(Decimal(hi_int), False))
                    return Never() if regex is None else Integer(regex, *bounds, float_is_integer)
        within = None  # other bounds: the range's regex, stepped beside the residues
        if integer:
            lo_int, hi_int = _integer_bounds(lo, hi)
            zero_lo = None if lo_int is None else Bound(Decimal(0), lo_int == 1)
            zero_hi = None if hi_int is None else Bound(Decimal(0), hi_int == -1)
            sign = _sign(
                lo if lo_int not in (0, 1) else zero_lo, hi if hi_int not in (0, -1) else zero_hi
            )
            if sign is None:
                within = integer_range_regex(lo_int, hi_int)
        else:
            sign = _sign(lo, hi)
            if sign is None:
                within = number_range_regex(
                    self._float_safe(lo, pointer, upper=False),
                    self._float_safe(hi, pointer, upper=True),
                )
        if sign is None:
            if within is None:
                return Never()
            sign = "any"
        decimals = max((_places(f) for f in (*musts, *nots)), default=0)
        try:
            spec = ResidueSpec(
                integer=integer,
                decimals=decimals,
                must=int(musts[0] * 10**decimals) if musts else 0,
                must_not=tuple(int(f * 10**decimals) for f in nots),
                sign=sign,
            )
        except GrammarError as exc:
            raise GrammarError(keyword="multipleOf", pointer=pointer, detail=exc.detail) from None
        if not spec.live(spec.start):
            return Never()
        if integer:
            return Integer(spec.atom(within), lo, hi, float_is_integer)
        return Number(spec.atom(within), lo, hi)

    def _bound(
        self, s: dict, inclusive: str, exclusive: str, pointer: str, *, upper: bool
    ) -> Bound | None:
        """The tighter of the inclusive and exclusive bound, in exact decimal."""
        candidates = []
        for key, strict in ((inclusive, False), (exclusive, True)):
            if key in s:
                candidates.append(Bound(_decimal(s[key], key, pointer), strict, raw=s[key]))
        if not candidates:
            return None

        def rank(b: Bound) -> tuple:
            return (b.value, not b.strict) if upper else (-b.value, not b.strict)

        return min(candidates, key=rank)

    def _float_safe(self, bound: Bound | None, pointer: str, *, upper: bool) -> Bound | None:
        """A bound on decimal text such that the double the text parses to obeys the
        schema's bound too (validators compare doubles). Strict bounds become the
        inclusive neighbouring double; a strict bound at 0 becomes +-1e-15 (narrower)."""
        if bound is None:
            return None
        raw = bound.raw
        assert raw is not None  # bounds read from a schema keep the number as written
        if abs(bound.value) >= _FLOAT_EXACT_LIMIT:
            if bound.strict or isinstance(raw, int):
                keyword = "exclusiveMaximum" if upper else "exclusiveMinimum"
                raise GrammarError(keyword=keyword, pointer=pointer, detail="bound beyond 2**53")
            return bound
        if not bound.strict:
            return Bound(_exact(raw), False)
        if bound.value == 0:
            return Bound(-EXCLUSIVE_ZERO_EPSILON if upper else EXCLUSIVE_ZERO_EPSILON, False)
        neighbour = math.nextafter(float(raw), -math.inf if upper else math.inf)
        return Bound(_exact(neighbour), False)

    # ------------------------------------------------------------ arrays

    def lower_array(self, s: dict, pointer: str, base: str) -> Node:
        build = self.builder.build
        prefix = [
            build(p, f"{pointer}/prefixItems/{i}", base)
            for i, p in enumerate(s.get("prefixItems", []))
        ]
        items_schema = s.get("items", True)
        if items_schema is False:
            items = None
        elif items_schema is True or items_schema == {}:
            items = self.builder.any_value()
        else:
            items = build(items_schema, f"{pointer}/items", base)
        min_items = non_negative_int(s, "minItems", pointer, 0)
        max_items = non_negative_int(s, "maxItems", pointer, None)
        array = Array(prefix, items, min_items, max_items)
        unique = s.get("uniqueItems") is True and not at_most_one_item(array)
        contains = "contains" in s and self.builder.draft >= 6
        if "_contains" in s and self.builder.draft < 6:  # a complement's (negation.py)
            ignored = ("_contains", "contains", "minContains", "maxContains")
            s = {**{k: v for k, v in s.items() if k not in ignored}, "contains": s["_contains"]}
            contains = True
        if contains:
            if unique:
                raise GrammarError(
                    keyword="uniqueItems", pointer=pointer, detail="together with contains"
                )
            return lower_contains(self.builder, s, array, pointer, base)
        return unique_array(array, pointer) if unique else array


def _patterns_by_difference(
    patterns: list, min_len: int, max_len: int | None, pointer: str
) -> str | None:
    """Strings of min_len..max_len characters every pattern finds, as differences
    (``TermStore.diff``): all of them, less those some pattern does not find."""
    base = repeat(any_json_char_regex(), min_len, max_len)
    if base is None:
        return None
    try:
        found = [pattern_regex(_pattern_text(p), 0, None) for p in patterns]
    except PatternError as exc:
        raise GrammarError(keyword="pattern", pointer=pointer, detail=str(exc)) from None
    if any(f is None for f in found):
        return None
    missed = alt([f"{DIFF_ATOM}({base})({f})" for f in found if f is not None])
    return base if missed is None else f"{DIFF_ATOM}({base})({missed})"


def _canonical_body(node: String) -> str:
    """Any string of the node's lengths, each character in its one canonical encoding."""
    return repeat(any_json_char_regex(), node.min_len, node.max_len) or ""


def _pattern_text(value: object) -> str:
    if not isinstance(value, str):
        raise GrammarError(keyword="pattern", detail="expected a string")
    return value


_MAX_SCANNED = 1 << 20  # integers of a bounded range tested one by one against the steps
_MAX_LISTED = 4096


def _integer_bounds(lo: Bound | None, hi: Bound | None) -> tuple[int | None, int | None]:
    """The least and greatest integers within the bounds (None: unbounded)."""
    lo_int = (
        None
        if lo is None
        else math.ceil(lo.value) + (1 if lo.strict and lo.value == math.ceil(lo.value) else 0)
    )
    hi_int = (
        None
        if hi is None
        else math.floor(hi.value) - (1 if hi.strict and hi.value == math.floor(hi.value) else 0)
    )
    return lo_int, hi_int


def _sign(lo: Bound | None, hi: Bound | None) -> str | None:
    """Bounds as a residue atom's sign: none, or one bound at 0 (None: anything else)."""
    if lo is not None and hi is not None:
        return None
    if lo is None and hi is None:
        return "any"
    bound = lo if lo is not None else hi
    assert bound is not None
    if bound.value != 0:
        return None
    if lo is not None:
        return "pos" if bound.strict else "nonneg"
    return "neg" if bound.strict else "nonpos"


def _fraction(value: object, key: str, pointer: str) -> Fraction:
    """A positive step as the rational its JSON text writes (0.01 is 1/100: the decimal,
    not the double nearest to it)."""
    exact = _decimal(value, key, pointer)
    if exact <= 0:
        raise GrammarError(keyword=key, pointer=pointer, detail="expected a positive number")
    if isinstance(value, float):
        return Fraction(repr(value))
    return Fraction(int(value)) if isinstance(value, int) else Fraction(exact)


def _places(f: Fraction) -> int:
    """Decimal places of a terminating decimal (its denominator is 2^a 5^b: max(a, b))."""
    q, twos, fives = f.denominator, 0, 0
    while q % 2 == 0:
        q, twos = q // 2, twos + 1
    while q % 5 == 0:
        q, fives = q // 5, fives + 1
    assert q == 1
    return max(twos, fives)


def _decimal(value: object, key: str, pointer: str) -> Decimal:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not math.isfinite(value))
    ):
        raise GrammarError(keyword=key, pointer=pointer, detail=f"expected a number, got {value!r}")
    return Decimal(value)


def _exact(value: int | float) -> Decimal:
    """A decimal that compares with every JSON number text as the double `value` does."""
    if isinstance(value, int) or value.is_integer():
        return Decimal(value)
    return Decimal(repr(value))
