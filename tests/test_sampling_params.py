"""SamplingParams validation: every bad value is a ValueError naming the field."""

from __future__ import annotations

import dataclasses

import pytest
from radixgen.grammar.compiler import KINDS

from radixgen import SamplingParams
from radixgen.sampling_params import CONSTRAINT_FIELDS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(min_p=2.0), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(frequency_penalty=3.0), "frequency_penalty"),
        (dict(stop=[""]), "stop"),
        (dict(stop=5), "stop"),
        (dict(logit_bias={999999: 1.0}), "logit_bias"),
        (dict(top_logprobs=50), "top_logprobs"),
        (dict(regex="a+", choices=["a"]), "at most one constraint"),
        (dict(json_schema="{not json"), "json_schema"),
        (dict(choices=[]), "choices"),
        # what the sampler cannot compute with is refused, naming the field
        (dict(temperature=float("inf")), "temperature"),
        (dict(temperature=1e308), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=float("nan")), "top_p"),
        (dict(repetition_penalty=1e-300), "repetition_penalty"),
        (dict(repetition_penalty=1e300), "repetition_penalty"),
        (dict(presence_penalty=float("-inf")), "presence_penalty"),
        (dict(logit_bias={5: float("nan")}), "logit_bias"),
        (dict(seed=2**70), "seed: expected a 64-bit integer"),
        (dict(seed="x"), "seed"),
        (dict(seed=True), "seed"),
        (dict(max_new_tokens=True), "max_new_tokens"),
        (dict(ignore_eos="false"), "ignore_eos: expected a boolean"),
        (dict(logprobs="true"), "logprobs: expected a boolean"),
        (dict(stop_token_ids=[49152]), "stop_token_ids: token id 49152 is outside"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
    ],
)
def test_bad_values_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs).validate(vocab_size=49152)


@pytest.mark.parametrize("top_k", [49152, 49153, 100_000, 10**20])
def test_top_k_past_the_vocabulary_is_off(top_k):
    """As vLLM reads it: every token is among the top k, so no filter (validate returns a copy)."""
    assert SamplingParams(top_k=top_k).validate(vocab_size=49152).top_k == -1
    assert SamplingParams(top_k=100).validate(vocab_size=49152).top_k == 100


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-6, 0.0])
def test_tiny_temperatures_are_greedy(temperature):
    assert SamplingParams(temperature=temperature).validate().is_greedy
    assert not SamplingParams(temperature=1e-4).validate().is_greedy


def test_defaults_are_valid_and_derived_views():
    p = SamplingParams(stop="x", temperature=0.0).validate()
    assert p.stop_strings == ["x"] and p.is_greedy and p.constraint is None
    assert SamplingParams(regex="a").constraint == ("regex", "a")
    assert SamplingParams(json_object=True).constraint == ("json_object", True)


def test_from_dict_rejects_unknown_fields():
    with pytest.raises(ValueError, match="unknown field"):
        SamplingParams.from_dict({"max_new_tokens": 3, "bogus": 1})
    assert SamplingParams.from_dict({"max_new_tokens": 3}).max_new_tokens == 3


def test_constraint_kinds_are_the_grammar_compilers():
    """One spelling per constraint kind: the SamplingParams field is the compiler's kind."""
    assert KINDS == CONSTRAINT_FIELDS
    assert SamplingParams(choices=["a", "b"]).constraint == ("choices", ["a", "b"])


def test_field_names_are_all_the_fields():
    assert SamplingParams.field_names() == [f.name for f in dataclasses.fields(SamplingParams)]
    assert "extra" not in SamplingParams.field_names()


# --------------------------------------------------------------------------- issue #17: SGLang's fields


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(min_new_tokens=-1), "min_new_tokens: expected an integer in"),
        (dict(max_new_tokens=4, min_new_tokens=5), r"min_new_tokens: .*max_new_tokens \(4\)"),
        (dict(min_new_tokens=1.5), "min_new_tokens"),
        (dict(min_new_tokens=True), "min_new_tokens"),
        (dict(stop_regex=5), "stop_regex: expected a string or a list"),
        (dict(stop_regex=["a", 3]), "stop_regex: expected"),
        (dict(stop_regex="("), "stop_regex: '\\(' is not a valid regex"),
        (dict(stop_regex=["x", "a*"]), "stop_regex: 'a\\*' matches the empty string"),
        (dict(stop_regex=["a"] * 17), "stop_regex: at most 16"),
        (dict(stop_regex="a" * 257), "stop_regex: at most 256 characters"),
        (dict(no_stop_trim="yes"), "no_stop_trim: expected a boolean"),
        (dict(spaces_between_special_tokens=False), "spaces_between_special_tokens: only true"),
        (dict(spaces_between_special_tokens=1), "spaces_between_special_tokens: expected a bool"),
        (dict(json_schema=False), "json_schema: the schema false"),
        (dict(json_schema="false"), "json_schema: the schema false"),
    ],
)
def test_sglang_fields_bad_values_name_the_field(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs).validate(vocab_size=49152)


def test_sglang_fields_good_values():
    p = SamplingParams(
        max_new_tokens=8, min_new_tokens=8, stop_regex=r"\d+", no_stop_trim=True
    ).validate()
    assert p.stop_regexes == [r"\d+"] and p.min_new_tokens == 8 and p.no_stop_trim
    assert SamplingParams(stop_regex=["a", "b"]).stop_regexes == ["a", "b"]
    assert SamplingParams().stop_regexes == [] and SamplingParams().min_new_tokens == 0


def test_from_dict_reads_nulls_and_empty_lists_as_not_set():
    """What SGLang's frontend sends for a plain ``gen`` (sglang/lang/ir.py's defaults)."""
    p = SamplingParams.from_dict(
        {
            "max_new_tokens": 16,
            "stop": [],
            "stop_token_ids": [],
            "stop_regex": [],
            "regex": None,
            "json_schema": None,
            "temperature": None,
        }
    ).validate()
    assert p == SamplingParams(max_new_tokens=16)
    assert p.constraint is None and p.stop_regexes == [] and p.temperature == 1.0
