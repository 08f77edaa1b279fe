"""Exact regexes for bounded JSON integers and decimals, and the canonical number form.

Numbers are compared as exact decimals. The grammar writes integers as ``-?(0|[1-9][0-9]*)``
and bounded numbers without exponent: ``-?(0|[1-9][0-9]*)(\\.[0-9]+)?``; ``-0`` is never
produced. The construction splits a range by sign, then by integer part, and compares the
fraction as a digit string (trailing zeros do not change its value):

    value = I . F      I: integer part (numeric range)   F: digit string (lexicographic range)
"""

from __future__ import annotations

import math
from decimal import Decimal

from ..lexer.regex_builders import alt, concat, digit_class, group, optional, repeat

INTEGER = r"-?(?:0|[1-9][0-9]*)"
NUMBER = r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?"
_ANY_FRACTION = r"(?:\.[0-9]+)?"
# Strict bounds on a double: "x > g" for x parsed as a binary double. Exclusive bounds at 0
# are replaced by this inclusive bound, so that no accepted text rounds to 0 (narrower).
EXCLUSIVE_ZERO_EPSILON = Decimal("1e-15")


# Numbers with a fractional part, written with at most 15 digits (leading "0" included) and
# no exponent: at 15 significant digits decimal -> double -> decimal round-trips, so such a
# text never parses to the double of an integer (unlike "1.0000000000000001"). Narrower
# than "every non-integer", never wider.
FRACTIONAL = (
    r"-?(?:0\.[0-9]{0,13}[1-9]|"
    + "|".join(
        "[1-9]" + (rf"[0-9]{{{k}}}" if k else "") + rf"\.[0-9]{{0,{13 - k}}}[1-9]"
        for k in range(14)
    )
    + ")"
)


def canonical_number(value: int | float) -> str:
    """How the grammar writes a JSON number: integers as integers, floats as plain
    decimals without exponent (``1e-07`` -> ``0.0000001``, ``2.0`` -> ``2.0``, ``-0.0`` ->
    ``0.0``). A float stays a float (draft-04 does not count 2.0 as an integer); where the
    schema says integer and the draft agrees, the Integer node writes ``2``."""
    if isinstance(value, bool):
        raise TypeError("booleans are not numbers")
    if isinstance(value, int):
        return str(value)
    if not math.isfinite(value):
        raise ValueError(f"JSON has no representation for {value!r}")
    if value.is_integer():
        return f"{int(value)}.0"
    return format(Decimal(repr(value)), "f")


def to_decimal(value: int | float) -> Decimal:
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


# ---------------------------------------------------------------- integers


_MAX_LISTED_MULTIPLES = 4096


def multiple_regex(k: int, lo: int | None, hi: int | None) -> str | None:
    """Integers in [lo, hi] (None: unbounded) that are multiples of ``k`` >= 2; None if
    there are none. Exact, written without leading zeros. A bounded range of at most 4,096
    multiples is their list; otherwise the range must be all integers, or start or end within
    one step of 0 (``minimum: 0``, ``exclusiveMinimum: 0``...), and the positive multiples are
    ``_positive_multiples``. Raises ``ValueError`` saying why for anything else (no compact
    exact regex)."""
    if lo is not None and hi is not None:
        first = -(-lo // k) * k
        if first > hi:
            return None
        if (hi - first) // k + 1 <= _MAX_LISTED_MULTIPLES:
            return alt([str(v) for v in range(first, hi + 1, k)])
    if lo is None and hi is None:
        return "-?" + group(f"0|{_positive_multiples(k)}")
    if hi is None and lo is not None and -k < lo <= k:  # from 0 or the first positive multiple
        return group(f"0|{_positive_multiples(k)}") if lo <= 0 else _positive_multiples(k)
    if lo is None and hi is not None and -k <= hi < k:
        negative = "-" + group(_positive_multiples(k))
        return group(f"0|{negative}") if hi >= 0 else negative
    raise ValueError("bounds other than around 0 with more than 4,096 multiples between them")


_MAX_REMAINDER_REGEX = 60_000  # characters: 3, 6 and 7 fit; 9, 11 and above do not
_MAX_REMAINDER_STEP = 16  # above it, refused at once (elimination costs ~k^3 before the check)


def _positive_multiples(k: int) -> str:
    """Positive numerals (no leading zero) that are multiples of ``k``: by their last digits
    where ``k`` divides 10, 100 or 1,000, else ``_remainder_regex``."""
    digits = next((m for m in (1, 2, 3) if 10**m % k == 0), None)
    if digits is None:
        return _remainder_regex(k)
    endings = alt([f"{e:0{digits}d}" for e in range(0, 10**digits, k)])
    assert endings is not None
    listed = alt([*(str(n) for n in range(k, 10**digits, k)), "[1-9][0-9]*" + group(endings)])
    assert listed is not None
    return listed


def _remainder_regex(k: int) -> str:
    """Positive numerals (no leading zero) that are multiples of ``k``: the automaton of
    remainders mod ``k`` (a digit takes r to (10r + d) mod k), written as a regex by state
    elimination, the state with the fewest paths through it first. Raises ``ValueError`` when
    the regex would pass ``_MAX_REMAINDER_REGEX`` characters."""
    too_long = ValueError(
        f"an unbounded multiple of {k} needs a regex of more than "
        f"{_MAX_REMAINDER_REGEX:,} characters"
    )
    if k > _MAX_REMAINDER_STEP:  # refused before any work: the automaton has k states
        raise too_long
    start, final = -1, -2
    edges: dict[tuple[int, int], str] = {}

    def add(p: int, q: int, regex: str) -> None:
        old = edges.get((p, q))
        edges[(p, q)] = regex if old is None else str(alt([old, regex]))

    def digits_to(source: int, first: int) -> dict[int, str]:
        by_target: dict[int, list[int]] = {}
        for d in range(first, 10):
            by_target.setdefault((10 * source + d) % k, []).append(d)
        return {t: _digit_set(ds) for t, ds in by_target.items()}

    def paths(q: int) -> int:  # through q: its in-edges times its out-edges
        ins = sum(1 for p, x in edges if x == q and p != q)
        return ins * sum(1 for x, r in edges if x == q and r != q)

    for target, digit in digits_to(0, 1).items():  # the first digit, from remainder 0
        add(start, target, digit)
    for r in range(k):
        for target, digit in digits_to(r, 0).items():
            add(r, target, digit)
    add(0, final, "")
    remaining = set(range(k))
    while remaining:
        q = min(sorted(remaining), key=paths)
        remaining.discard(q)
        loop = edges.pop((q, q), None)
        star = group(loop) + "*" if loop else ""
        ins = [(p, edges.pop((p, x))) for p, x in list(edges) if x == q]
        outs = [(r, edges.pop((x, r))) for x, r in list(edges) if x == q]
        for p, a in ins:
            for r, c in outs:
                add(p, r, a + star + c)
        if sum(map(len, edges.values())) > _MAX_REMAINDER_REGEX:
            raise too_long
    return edges[(start, final)]


def _digit_set(digits: list[int]) -> str:
    """One digit of ``digits`` (ascending) as a literal or a class."""
    if len(digits) == 1:
        return str(digits[0])
    if digits == list(range(digits[0], digits[-1] + 1)):
        return f"[{digits[0]}-{digits[-1]}]"
    return "[" + "".join(map(str, digits)) + "]"


def integer_range_regex(lo: int | None, hi: int | None) -> str | None:
    """Integers in [lo, hi] (None: unbounded), written without leading zeros or -0."""
    if lo is None and hi is None:
        return INTEGER
    if lo is not None and hi is not None and lo > hi:
        return None
    options: list[str | None] = []
    if hi is None or hi >= 0:
        options += _nonneg_range(max(lo or 0, 0), hi)
    if lo is None or lo < 0:
        negative = _nonneg_range(
            max(1, -hi) if hi is not None else 1, -lo if lo is not None else None
        )
        options.append(concat(["-", alt(negative)]) if negative else None)
    return alt(options)


def _nonneg_range(lo: int, hi: int | None) -> list[str]:
    """Alternatives for non-negative numerals in [lo, hi], grouped by digit count."""
    out = []
    min_len = len(str(lo))
    max_len = len(str(hi)) if hi is not None else min_len
    for n in range(min_len, max_len + 1):
        first = 10 ** (n - 1) if n > 1 else 0
        last = 10**n - 1
        a, b = max(lo, first), last if hi is None else min(hi, last)
        if a <= b:
            out.append(_same_length_range(str(a), str(b)))
    if hi is None:
        out.append(f"[1-9][0-9]{{{min_len},}}")
    return out


def _same_length_range(lo: str, hi: str) -> str:
    """Digit strings of one length between lo and hi (inclusive)."""
    if lo == hi:
        return lo
    if lo[0] == hi[0]:
        return lo[0] + group(_same_length_range(lo[1:], hi[1:]))
    k = len(lo) - 1
    any_tail = "[0-9]" + (f"{{{k}}}" if k > 1 else "") if k else ""
    parts: list[str | None] = []
    start, end = int(lo[0]), int(hi[0])
    if lo[1:] != "0" * k:
        parts.append(lo[0] + group(_same_length_range(lo[1:], "9" * k)))
        start += 1
    last = None
    if hi[1:] != "9" * k:
        last = hi[0] + group(_same_length_range("0" * k, hi[1:]))
        end -= 1
    if start <= end:
        parts.append(concat([digit_class(start, end), any_tail]))
    if last:
        parts.append(last)
    return alt(parts) or ""


# ---------------------------------------------------------------- decimals


class Bound:
    """One end of a numeric interval: a decimal value and whether it is excluded."""

    __slots__ = ("value", "strict", "raw")

    def __init__(self, value: Decimal, strict: bool, raw: int | float | None = None) -> None:
        self.value, self.strict, self.raw = value, strict, raw  # raw: as written in the schema

    def __repr__(self) -> str:
        return f"Bound({self.value}, strict={self.strict})"


def number_range_regex(lo: Bound | None, hi: Bound | None) -> str | None:
    """Decimals (no exponent, no -0) with lo <= value <= hi (< where strict)."""
    if lo is None and hi is None:
        return NUMBER
    if lo is not None and hi is not None:
        if lo.value > hi.value or (lo.value == hi.value and (lo.strict or hi.strict)):
            return None
    options: list[str | None] = []
    if hi is None or hi.value > 0 or (hi.value == 0 and not hi.strict):
        low = lo if lo is not None and lo.value >= 0 else Bound(Decimal(0), False)
        options.append(_magnitude(low, hi))
    if lo is None or lo.value < 0:
        if hi is not None and hi.value < 0:
            m_lo = Bound(-hi.value, hi.strict)
        else:
            m_lo = Bound(Decimal(0), True)
        m_hi = Bound(-lo.value, lo.strict) if lo is not None else None
        magnitude = _magnitude(m_lo, m_hi)
        options.append(None if magnitude is None else "-" + group(magnitude))
    return alt(options)


def _split(value: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits (no trailing zeros) of a non-negative decimal."""
    text = format(value, "f")
    whole, _, fraction = text.partition(".")
    return int(whole), fraction.rstrip("0")


def _magnitude(lo: Bound, hi: Bound | None) -> str | None:
    """Unsigned decimals in the interval (0 <= lo.value)."""
    lo_int, lo_frac = _split(lo.value)
    if hi is None:
        above = _nonneg_range(lo_int + 1, None)
        return alt(
            [
                concat([alt(above), _ANY_FRACTION]),
                concat([str(lo_int), _fraction(*fraction_ge(lo_frac, lo.strict))]),
            ]
        )
    hi_int, hi_frac = _split(hi.value)
    if lo_int == hi_int:
        return concat(
            [str(lo_int), _fraction(*fraction_between(lo_frac, hi_frac, lo.strict, hi.strict))]
        )
    options: list[str | None] = []
    if lo_int + 1 <= hi_int - 1:
        options.append(concat([alt(_nonneg_range(lo_int + 1, hi_int - 1)), _ANY_FRACTION]))
    options.append(concat([str(lo_int), _fraction(*fraction_ge(lo_frac, lo.strict))]))
    options.append(concat([str(hi_int), _fraction(*fraction_le(hi_frac, hi.strict))]))
    return alt(options)


def _fraction(has_empty: bool, nonempty: str | None) -> str | None:
    """The fraction part: no '.' (the empty digit string) or '.' and nonempty digits."""
    if nonempty is None:
        return "" if has_empty else None
    body = r"\." + nonempty
    return optional(body) if has_empty else body


# A fraction language is (accepts the empty digit string, regex for nonempty digit strings).
# `digits` arguments are fraction digits without trailing zeros; 0.D compares D padded
# with zeros, so "5" == "50" and "" == "0".


def fraction_ge(digits: str, strict: bool) -> tuple[bool, str | None]:
    """Digit strings D with 0.D >= 0.digits (> when strict)."""
    if not digits:
        return (False, "0*[1-9][0-9]*") if strict else (True, "[0-9]+")
    return False, _ge(digits, strict)


def fraction_le(digits: str, strict: bool) -> tuple[bool, str | None]:
    """Digit strings D with 0.D <= 0.digits (< when strict)."""
    if not digits:
        return (False, None) if strict else (True, "0+")
    return True, _le(digits, strict)


def fraction_between(lo: str, hi: str, lo_strict: bool, hi_strict: bool) -> tuple[bool, str | None]:
    """Digit strings D with 0.lo <= 0.D <= 0.hi (strict ends excluded)."""
    if lo == hi:
        if lo_strict or hi_strict:
            return False, None
        return (True, "0+") if not lo else (False, f"{lo}0*")
    i = 0
    while (lo[i] if i < len(lo) else "0") == hi[i]:
        i += 1
    prefix, lo_digit, hi_digit = hi[:i], int(lo[i]) if i < len(lo) else 0, int(hi[i])
    options: list[str | None] = []
    middle = digit_class(lo_digit + 1, hi_digit - 1)
    if middle:
        options.append(f"{prefix}{middle}[0-9]*")
    options.append(concat([prefix, str(lo_digit), _ge_tail(lo[i + 1 :], lo_strict)]))
    options.append(concat([prefix, str(hi_digit), _le_tail(hi[i + 1 :], hi_strict)]))
    if not lo_strict:
        options.append(_equal_to(lo, i - len(lo)))
    return not lo and not lo_strict, alt(options)


def _equal_to(digits: str, max_zeros: int) -> str | None:
    """Nonempty D equal in value to 0.digits with at most max_zeros trailing zeros added."""
    if digits:
        return digits + (repeat("0", 0, max_zeros) or "")
    return repeat("0", 1, max_zeros) if max_zeros >= 1 else None


def _leading_zeros(digits: str) -> int:
    return len(digits) - len(digits.lstrip("0"))


def _ge(digits: str, strict: bool) -> str | None:
    """Possibly-empty D with 0.D >= 0.digits (digits nonempty, nonzero)."""
    zeros = _leading_zeros(digits)
    if zeros >= 2:  # a nonzero digit among the first `zeros` digits, or those zeros and more
        return alt(
            [
                f"0{{0,{zeros - 1}}}[1-9][0-9]*",
                concat([f"0{{{zeros}}}", _ge(digits[zeros:], strict)]),
            ]
        )
    head = int(digits[0])
    return alt(
        [
            concat([digit_class(head + 1, 9), "[0-9]*"]),
            concat([digits[0], _ge_tail(digits[1:], strict)]),
        ]
    )


def _ge_tail(digits: str, strict: bool) -> str | None:
    if not digits:
        return "0*[1-9][0-9]*" if strict else "[0-9]*"
    return group(_ge(digits, strict) or "")


def _le(digits: str, strict: bool) -> str | None:
    """Nonempty D with 0.D <= 0.digits (digits nonempty, nonzero)."""
    zeros = _leading_zeros(digits)
    if zeros >= 2:  # only zeros so far, or the zeros and then at most the rest
        return alt([f"0{{1,{zeros}}}", concat([f"0{{{zeros}}}", _le(digits[zeros:], strict)])])
    head = int(digits[0])
    return alt(
        [
            concat([digit_class(0, head - 1), "[0-9]*"]),
            concat([digits[0], _le_tail(digits[1:], strict)]),
        ]
    )


def _le_tail(digits: str, strict: bool) -> str | None:
    """Possibly-empty S with 0.S <= 0.digits."""
    if not digits:
        return None if strict else "0*"
    return optional(_le(digits, strict))
