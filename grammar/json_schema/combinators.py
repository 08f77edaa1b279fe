"""Boolean combinators: anyOf, oneOf and not.

* anyOf: the rest of the schema is merged into every branch; a branch another branch
  subsumes is dropped (`disjoint.subsumes`).
* oneOf: compiled as anyOf when the branches are provably disjoint; object branches that
  overlap are narrowed to "exactly one branch's required properties all present"; other
  overlapping branches become "this branch and not the others" (each `not` an exact
  complement, `negation`), or are refused where a branch has none.
* not: of types (`not: {type: integer}` keeps numbers with a fractional part, `FRACTIONAL`),
  of values (enum/const, where the excluded values can be cut out exactly),
  of `required` (a presence constraint), and `not: {not: S}` = S; any other `not: S` is
  S's complement as schemas (`negation`), where it has one.
"""

from __future__ import annotations

from functools import reduce

from ..errors import GrammarError
from .disjoint import disjoint, uncovered
from .ir import Boolean, Const, Never, Node, Null, Number, String, Union
from .lowering import Lowering
from .names import names_not_in
from .negation import any_of, complement, value_complement
from .numbers import FRACTIONAL
from .resolve import METADATA, RecursionCutoff, merge
from .strings import string_not_in_regex
from .values import json_equal, json_type, write_generic

_NUMBER_KEYWORDS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "_not_multipleOf"}
)


def lower_group(builder: Lowering, s: dict, groups: list, pointer: str, base: str) -> Node:
    (keyword, branches), remaining = groups[0], groups[1:]
    if not isinstance(branches, list) or not branches:
        raise GrammarError(keyword=keyword, pointer=pointer, detail="expected a non-empty array")
    rest = {k: v for k, v in s.items() if k != "_groups"}
    if remaining:
        rest["_groups"] = remaining
    parts = [
        [(rest, pointer), (branch, f"{pointer}/{keyword}/{i}")] for i, branch in enumerate(branches)
    ]
    options = [builder.build_merged(p, base, pointer) for p in parts]
    if keyword == "oneOf":
        options = exclusive_branches(builder, options, parts, base, pointer)
    live = [o for o in options if not (isinstance(o, Never) and not o.cutoff)]
    if keyword == "anyOf":  # drop branches another branch already covers
        live = uncovered(live)
    if not live:
        return Never()
    return live[0] if len(live) == 1 else Union(live)


def exclusive_branches(
    builder: Lowering, options: list[Node], parts: list, base: str, pointer: str
) -> list[Node]:
    """oneOf branches made mutually exclusive. Provably disjoint branches stay as they
    are; an object branch overlapping others is narrowed to objects lacking at least
    one property each of them requires (their necessary condition), which is exact
    for "exactly one branch holds" and narrower only where a branch fails otherwise;
    a branch overlapping others without that shape excludes them by complements."""
    overlaps: dict[int, list[int]] = {i: [] for i in range(len(options))}
    for i, a in enumerate(options):
        for j in range(i + 1, len(options)):
            if not disjoint(a, options[j]):
                overlaps[i].append(j)
                overlaps[j].append(i)
    if not any(overlaps.values()):
        return options
    shapes = [branch_shape(builder, p, base, pointer) for p in parts]
    # the oneOf's own required names hold in every branch: they tell no branch apart
    shared = set(branch_shape(builder, parts[0][:1], base, pointer)[1])
    narrowed = list(options)
    for i, others in overlaps.items():
        if not others:
            continue
        not_all = []
        for j in [i, *others]:
            types, required = shapes[j][0], [n for n in shapes[j][1] if n not in shared]
            if types != {"object"} or (j != i and not required):
                narrowed[i] = _excluding_others(builder, parts, i, others, base, pointer)
                break
            if j != i:
                not_all.append(("oneOf", required))
        else:
            narrowed[i] = builder.build_merged(
                [*parts[i], ({"_not_all": not_all}, pointer)], base, pointer
            )
    return narrowed


def _excluding_others(
    builder: Lowering, parts: list, i: int, others: list[int], base: str, pointer: str
) -> Node:
    """Branch ``i`` and not any overlapping branch: ``Bi and not Bj`` for each ``j`` (the
    oneOf's other keywords hold in both, so ``not Bj`` suffices), each ``not`` the branch's
    exact complement (``negation``); refused where a branch has none."""
    nots = [parts[j][1][0] for j in others]
    try:
        return builder.build_merged([*parts[i], ({"_nots": nots}, pointer)], base, pointer)
    except (GrammarError, RecursionError) as err:
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        why = why.removeprefix("json_schema: unsupported ")
        raise GrammarError(
            keyword="oneOf",
            pointer=pointer,
            detail=f"branches may overlap, and one has no exact complement: {why}",
        ) from None


def branch_shape(
    builder: Lowering, parts: list, base: str, pointer: str
) -> tuple[set[str], list[str]]:
    """(allowed types, required names) of a merged branch, without lowering it."""
    depth = len(builder.ref_stack)
    try:
        flat = [builder.flatten(schema, part_pointer, base)[0] for schema, part_pointer in parts]
        merged = reduce(lambda a, b: merge(a, b, pointer), flat)
    except RecursionCutoff:
        raise GrammarError(
            keyword="oneOf", pointer=pointer, detail="branches may overlap"
        ) from None
    finally:
        del builder.ref_stack[depth:]
    required = merged.get("required", [])
    return builder.allowed_types(merged, pointer), list(required) if isinstance(
        required, list
    ) else []


def lower_not(builder: Lowering, s: dict, nots: list, pointer: str, base: str) -> Node:
    rest = {k: v for k, v in s.items() if k != "_nots"}
    types = builder.allowed_types(rest, pointer)
    excluded: list = []
    doubled: list = []  # not {not: S} is S; other negations: S's complement as schemas
    fractional = False  # `not: {type: integer}` where numbers are allowed
    for negated in nots:
        where = f"{pointer}/not"
        if negated is False:
            continue
        flat, _ = builder.flatten(negated, where, base)
        keys = set(flat) - METADATA
        if not keys:
            return Never()
        if keys == {"type"}:
            negated_types = builder.allowed_types(flat, where)
            fractional = fractional or ("integer" in negated_types and "number" in types)
            types -= negated_types
        elif keys == {"enum"}:
            excluded += flat["enum"]
        elif keys == {"_nots"} and len(flat["_nots"]) == 1:
            doubled.append((flat["_nots"][0], f"{where}/not"))
        elif keys == {"required"} and isinstance(flat["required"], list):
            types &= {"object"}  # non-objects satisfy any `required`
            rest["_not_all"] = [*rest.get("_not_all", []), ("not", flat["required"])]
        else:
            complemented = complement(builder, negated, where, base, "not")
            if not complemented:
                return Never()  # S accepts everything
            fails = any_of(complemented)
            doubled.append((fails, where))
    if fractional:
        if not (doubled or excluded or set(rest) & _NUMBER_KEYWORDS):
            return _fractional(builder, rest, types, pointer, base)
        # with other constraints on the numbers: not a multiple of 1, as residues
        rest["_not_multipleOf"] = [*rest.get("_not_multipleOf", []), 1]
    rest["type"] = sorted(types)
    if not types:
        return Never()
    parts = [(rest, pointer), *doubled]
    node = (
        builder.build_merged(parts, base, pointer)
        if doubled
        else builder.lower(rest, pointer, base)
    )
    if not excluded:
        return node
    try:
        return _exclude_values(node, excluded, pointer)
    except GrammarError as first:  # numbers between the excluded ones, and so on
        try:
            others = value_complement(excluded, f"{pointer}/not", "not")
        except GrammarError:
            raise first from None
        fails = others[0] if len(others) == 1 else {"anyOf": others}
        return builder.build_merged([*parts, (fails, f"{pointer}/not")], base, pointer)


def _fractional(builder: Lowering, rest: dict, types: set[str], pointer: str, base: str) -> Node:
    """Numbers that are not integers (`FRACTIONAL`, exponents included), next to the other
    allowed types, where nothing else constrains the numbers (else: residues)."""
    others = types - {"number"}
    options: list[Node] = [Number(FRACTIONAL)]
    if others:
        options.insert(0, builder.lower({**rest, "type": sorted(others)}, pointer, base))
    return options[0] if len(options) == 1 else Union(options)


def _exclude_values(node: Node, excluded: list, pointer: str) -> Node:
    """`node` minus finitely many values, where that is expressible exactly."""
    if isinstance(node, Union):
        return Union([_exclude_values(o, excluded, pointer) for o in node.options])
    if isinstance(node, Const):
        kept = [
            (v, t)
            for v, t in zip(node.values, node.texts)
            if not any(json_equal(v, e) for e in excluded)
        ]
        candidates = [v for v in node.all_values if not any(json_equal(v, e) for e in excluded)]
        return Const([v for v, _ in kept], [t for _, t in kept], candidates, node.float_is_integer)
    hits = [e for e in excluded if json_type(e) in node.json_types]
    if not hits:
        return node
    if isinstance(node, (Null, Boolean)):
        remaining = [
            v
            for v in ([None] if isinstance(node, Null) else [True, False])
            if not any(json_equal(v, e) for e in hits)
        ]
        return Const(remaining, [write_generic(v) for v in remaining], remaining)
    if isinstance(node, String) and node.unconstrained:  # keeps its length bounds
        words = [e for e in hits if isinstance(e, str)]
        if (node.min_len, node.max_len) == (0, None):
            return String(string_not_in_regex(words))
        body = names_not_in(words, node.min_len, node.max_len)
        return Never() if body is None else String(body, False, node.min_len, node.max_len)
    raise GrammarError(keyword="not", pointer=pointer, detail="excluding values of this type")
