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
    ],
)
def test_bad_values_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs).validate(vocab_size=49152)


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
