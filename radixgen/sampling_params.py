"""SamplingParams: the one definition of a request's decoding options.

It flows unchanged from the HTTP layer, the DSL's ``gen(...)`` and the offline API to the sampler.
Build variants with ``dataclasses.replace``; call ``validate()`` once at submit time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from .options import json_file, option, text_file

CONSTRAINT_FIELDS = ("json_schema", "regex", "ebnf", "choices", "json_object", "structural_tag")
GREEDY_TEMPERATURE = 1e-5  # a temperature below this samples greedily (dividing by it overflows)
MAX_TEMPERATURE = 1e6  # past this every distribution is uniform in float32 anyway
PENALTY_RANGE = (1e-2, 1e2)  # repetition_penalty: logits scaled past float32 beyond these
BOOL_FIELDS = (
    "ignore_eos",
    "logprobs",
    "json_object",
    "skip_special_tokens",
    "no_stop_trim",
    "spaces_between_special_tokens",
)
UNSET_WHEN_EMPTY = ("stop", "stop_regex", "stop_token_ids")
MAX_STOPS = 16  # stop strings, and stop regexes, per request
MAX_STOP_REGEX_LEN = 256  # characters of one stop_regex pattern
MAX_SALT_LEN = 1024  # characters of a cache_salt
INT64_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class SamplingParams:
    """A request's decoding options. Those declared with ``option`` are also the sampling flags
    of ``radixgen generate`` / ``chat`` (group "sampling") and the constraint flags of
    ``generate`` (group "constraint"), with these defaults."""

    max_new_tokens: int = option(128, "most tokens to generate", group="sampling")
    temperature: float = option(1.0, "sampling temperature (0: greedy)", group="sampling")
    top_p: float = option(
        1.0, "sample from the most likely tokens holding this much probability", group="sampling"
    )
    top_k: int = option(-1, "sample from the k most likely tokens (-1: off)", group="sampling")
    min_p: float = 0.0
    seed: int | None = option(None, "random seed (default: unseeded)", group="sampling")
    stop: str | list[str] | None = option(
        None, "stop string (repeatable)", metavar="STRING", group="sampling"
    )
    stop_token_ids: list[int] | None = None
    stop_regex: str | list[str] | None = None  # Python ``re``: stop where the text first matches
    no_stop_trim: bool = False  # keep the matched stop string / regex match in the output
    min_new_tokens: int = 0  # EOS and stop_token_ids are masked until this many were generated
    # With a reasoning parser: the reasoning is closed (its end marker forced) after this many
    # tokens of it (thinking.py); None: no bound but max_new_tokens.
    max_thinking_tokens: int | None = option(
        None,
        "with a reasoning model: close the reasoning after this many tokens of it",
        group="sampling",
    )
    # A namespace of the prefix cache (vLLM's cache_salt, SGLang's extra_key): requests with
    # different salts never share a cached token; the same salt shares as before; None is the
    # unsalted namespace (mem_cache.salted_key).
    cache_salt: str | None = None
    # The LoRA adapter to run on, by its served name (SGLang's lora_path; None: the base model).
    # Its KV is its own prefix-cache namespace, as a salt's.
    lora_path: str | None = None
    # With --enable-priority-scheduling: waiting requests of a higher priority are admitted
    # first, and a retraction takes the lowest priority first (SGLang's order; 0 otherwise).
    priority: int = 0
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    json_schema: dict[str, Any] | str | None = option(
        None,
        "constrain to the JSON Schema in this file",
        metavar="FILE",
        parse=json_file,
        group="constraint",
    )
    regex: str | None = option(None, "constrain to this regular expression", group="constraint")
    ebnf: str | None = option(
        None,
        "constrain to the EBNF (GBNF) grammar in this file (start rule: root)",
        metavar="FILE",
        parse=text_file,
        group="constraint",
    )
    choices: list[str] | None = option(
        None,
        "constrain to one of these strings (repeatable)",
        flag="--choice",
        metavar="CHOICE",
        group="constraint",
    )
    json_object: bool = False
    structural_tag: dict[str, Any] | str | None = option(  # grammar/structural_tag.py
        None,
        "constrain to the structural tag in this JSON file (free text, then tagged parts)",
        metavar="FILE",
        parse=json_file,
        group="constraint",
    )
    skip_special_tokens: bool = True
    # Only True: radixgen's tokenizers decode as Hugging Face fast tokenizers do, which have no
    # such option (special tokens are joined to the text as the tokenizer's decoder joins them).
    spaces_between_special_tokens: bool = True

    # ------------------------------------------------------------------ derived views
    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def stop_regexes(self) -> list[str]:
        if self.stop_regex is None:
            return []
        return [self.stop_regex] if isinstance(self.stop_regex, str) else list(self.stop_regex)

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def constraint(self) -> tuple[str, Any] | None:
        """``(kind, spec)`` of the single constraint, or None."""
        for name in CONSTRAINT_FIELDS:
            value = getattr(self, name)
            if value not in (None, False):
                return name, value
        return None

    @property
    def needs_penalties(self) -> bool:
        return (
            self.repetition_penalty != 1.0
            or self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
        )

    # ------------------------------------------------------------------ validation
    def validate(self, vocab_size: int | None = None) -> SamplingParams:
        """Raise ``ValueError`` naming the field for bad values; returns the params to run:
        ``self``, or a copy with ``top_k`` at or above ``vocab_size`` turned off (-1), as vLLM
        reads it.

        Every number is checked against what the sampler computes with: floats must be finite
        (and temperature at most ``MAX_TEMPERATURE``; below ``GREEDY_TEMPERATURE`` it is greedy),
        integers that reach torch fit int64, booleans must be booleans."""
        for name in BOOL_FIELDS:
            value = getattr(self, name)
            _check(isinstance(value, bool), f"{name}: expected a boolean, got {value!r}")
        _check(
            _is_int(self.max_new_tokens) and self.max_new_tokens >= 1,
            f"max_new_tokens: expected an integer >= 1, got {self.max_new_tokens!r}",
        )
        _check(
            _is_int(self.min_new_tokens) and 0 <= self.min_new_tokens <= self.max_new_tokens,
            f"min_new_tokens: expected an integer in [0, max_new_tokens ({self.max_new_tokens})], "
            f"got {self.min_new_tokens!r}",
        )
        _check(
            self.max_thinking_tokens is None
            or (_is_int(self.max_thinking_tokens) and self.max_thinking_tokens >= 0),
            f"max_thinking_tokens: expected an integer >= 0, got {self.max_thinking_tokens!r}",
        )
        _check(
            _is_int(self.priority) and INT64_RANGE[0] <= self.priority <= INT64_RANGE[1],
            f"priority: expected an integer, got {self.priority!r}",
        )
        _check(
            self.cache_salt is None
            or (isinstance(self.cache_salt, str) and 0 < len(self.cache_salt) <= MAX_SALT_LEN),
            f"cache_salt: expected a non-empty string of at most {MAX_SALT_LEN} characters, "
            f"got {self.cache_salt!r}"[:200],
        )
        _check(
            self.lora_path is None
            or (isinstance(self.lora_path, str) and 0 < len(self.lora_path) <= MAX_SALT_LEN),
            f"lora_path: expected an adapter name, got {self.lora_path!r}"[:200],
        )
        _check(
            self.spaces_between_special_tokens,
            "spaces_between_special_tokens: only true is supported (radixgen decodes like a "
            "Hugging Face fast tokenizer, which has no such option)",
        )
        _check(
            _is_number(self.temperature) and 0.0 <= self.temperature <= MAX_TEMPERATURE,
            f"temperature: expected a number in [0, {MAX_TEMPERATURE:g}], got {self.temperature!r}",
        )
        _check(
            _is_number(self.top_p) and 0.0 < self.top_p <= 1.0,
            f"top_p: expected a number in (0, 1], got {self.top_p!r}",
        )
        _check(
            _is_int(self.top_k) and (self.top_k == -1 or self.top_k >= 1),
            f"top_k: expected -1 (off) or an integer >= 1, got {self.top_k!r}",
        )
        _check(
            _is_number(self.min_p) and 0.0 <= self.min_p <= 1.0,
            f"min_p: expected a number in [0, 1], got {self.min_p!r}",
        )
        low, high = PENALTY_RANGE
        _check(
            _is_number(self.repetition_penalty) and low <= self.repetition_penalty <= high,
            f"repetition_penalty: expected a number in [{low:g}, {high:g}], "
            f"got {self.repetition_penalty!r}",
        )
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            _check(
                _is_number(value) and -2.0 <= value <= 2.0,
                f"{name}: expected a number in [-2, 2], got {value!r}",
            )
        _check(
            self.seed is None
            or (_is_int(self.seed) and INT64_RANGE[0] <= self.seed <= INT64_RANGE[1]),
            f"seed: expected a 64-bit integer, got {self.seed!r}",
        )
        _check(
            _is_int(self.top_logprobs) and 0 <= self.top_logprobs <= 20,
            f"top_logprobs: expected an integer in [0, 20], got {self.top_logprobs!r}",
        )
        self._validate_stops(vocab_size)
        self._validate_logit_bias(vocab_size)
        self._validate_constraint()
        if vocab_size is not None and self.top_k >= vocab_size:
            return self.replace(top_k=-1)  # every token is in the top k: no filter
        return self

    def _validate_stops(self, vocab_size: int | None) -> None:
        stops = self.stop
        _check(_strings(stops), f"stop: expected a string or a list of strings, got {stops!r}")
        _check(all(self.stop_strings), "stop: stop strings must be non-empty")
        _check(
            len(self.stop_strings) <= MAX_STOPS,
            f"stop: at most {MAX_STOPS} stop strings, got {len(self.stop_strings)}",
        )
        self._validate_stop_regex()
        ids = self.stop_token_ids
        _check(
            ids is None or (isinstance(ids, list) and all(_is_int(i) for i in ids)),
            f"stop_token_ids: expected a list of integers, got {ids!r}",
        )
        if ids and vocab_size is not None:
            bad = [i for i in ids if not 0 <= i < vocab_size]
            _check(
                not bad,
                f"stop_token_ids: token id {bad[0] if bad else 0} is outside the vocabulary "
                f"[0, {vocab_size})",
            )

    def _validate_stop_regex(self) -> None:
        regexes = self.stop_regex
        _check(
            _strings(regexes),
            f"stop_regex: expected a string or a list of strings, got {regexes!r}",
        )
        _check(
            len(self.stop_regexes) <= MAX_STOPS,
            f"stop_regex: at most {MAX_STOPS} patterns, got {len(self.stop_regexes)}",
        )
        for pattern in self.stop_regexes:
            _check(
                len(pattern) <= MAX_STOP_REGEX_LEN,
                f"stop_regex: at most {MAX_STOP_REGEX_LEN} characters a pattern, got {len(pattern)}",
            )
            try:
                compiled = re.compile(pattern)
            except (re.error, RecursionError, OverflowError) as exc:
                raise ValueError(f"stop_regex: {pattern!r} is not a valid regex ({exc})") from None
            _check(
                compiled.search("") is None,
                f"stop_regex: {pattern!r} matches the empty string (it would stop at once)",
            )

    def _validate_logit_bias(self, vocab_size: int | None) -> None:
        if self.logit_bias is None:
            return
        _check(
            isinstance(self.logit_bias, dict),
            f"logit_bias: expected an object, got {self.logit_bias!r}",
        )
        for token_id, bias in self.logit_bias.items():
            _check(
                _is_int(token_id)
                and token_id >= 0
                and (vocab_size is None or token_id < vocab_size),
                f"logit_bias: token id {token_id!r} is not in the vocabulary",
            )
            _check(
                _is_number(bias) and -100 <= bias <= 100,
                f"logit_bias: bias for token {token_id} must be a number in [-100, 100], got {bias!r}",
            )

    def _validate_constraint(self) -> None:
        given = [name for name in CONSTRAINT_FIELDS if getattr(self, name) not in (None, False)]
        _check(len(given) <= 1, f"at most one constraint per request, got {', '.join(given)}")
        schema = _parsed_json(self.json_schema, "json_schema")
        _check(
            schema is not False,
            "json_schema: the schema false matches no value; give a schema that allows one",
        )
        _check(
            self.json_schema is None or isinstance(self.json_schema, (dict, str, bool)),
            f"json_schema: expected an object or a JSON string, got {type(self.json_schema).__name__}",
        )
        _check(
            self.regex is None or isinstance(self.regex, str),
            f"regex: expected a string, got {self.regex!r}",
        )
        _check(
            self.ebnf is None or isinstance(self.ebnf, str),
            f"ebnf: expected a string, got {type(self.ebnf).__name__}",
        )
        tag = _parsed_json(self.structural_tag, "structural_tag")
        _check(
            tag is None or isinstance(tag, dict),
            f"structural_tag: expected an object or a JSON string, got {type(tag).__name__}",
        )
        if self.choices is not None:
            _check(
                isinstance(self.choices, list)
                and len(self.choices) > 0
                and all(isinstance(c, str) and c for c in self.choices),
                "choices: expected a non-empty list of non-empty strings",
            )

    def replace(self, **changes: Any) -> SamplingParams:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SamplingParams:
        """Build from a dict (HTTP bodies, DSL kwargs); unknown keys raise ``ValueError``. A null
        value, or an empty ``stop`` / ``stop_regex`` / ``stop_token_ids`` list, is the field not
        set (its default), as SGLang's frontend sends them."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"sampling params: unknown field(s) {', '.join(unknown)}")
        given = {k: v for k, v in data.items() if v is not None and not _empty_list(k, v)}
        return cls(**given)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]


def _empty_list(name: str, value: Any) -> bool:
    return name in UNSET_WHEN_EMPTY and isinstance(value, list) and not value


def _is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parsed_json(value: Any, field: str) -> Any:
    """``value``, parsed when it is JSON text (a ``ValueError`` naming ``field`` if bad)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{field}: not valid JSON ({exc})") from None


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _strings(value: object) -> bool:
    """None, a string, or a list of strings (``stop``, ``stop_regex``)."""
    return (
        value is None
        or isinstance(value, str)
        or (isinstance(value, list) and all(isinstance(v, str) for v in value))
    )
