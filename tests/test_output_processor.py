"""OutputProcessor on a one-character-per-token tokenizer (no model): finish reasons, stop
strings cut exactly, held-back tails, logprobs per delta."""

from __future__ import annotations

import pytest
import torch

from radixgen.constrained import Constraints
from radixgen.detokenizer import IncrementalDetokenizer, StopStringMatcher
from radixgen.output_processor import OutputProcessor, error_delta, make_delta
from radixgen.outputs import EngineStats
from radixgen.request import Req, TokenLogprob
from radixgen.sampling_params import SamplingParams

EOS = 0


class CharTokenizer:
    """Token ``i`` is the character ``chr(ord('a') + i - 1)``; token 0 is EOS (decodes to "")."""

    eos_token_ids = [EOS]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i - 1) for i in ids if i != EOS)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) - ord("a") + 1 for c in text]


def tokens(text: str) -> list[int]:
    return CharTokenizer().encode(text)


def make(context_len: int = 100) -> tuple[OutputProcessor, EngineStats]:
    tok = CharTokenizer()
    stats = EngineStats()
    constraints = Constraints(tok, 27, torch.device("cpu"))
    return OutputProcessor(constraints, tok.eos_token_ids, context_len, stats), stats


def make_req(prompt: str = "xy", **params: object) -> Req:
    p = SamplingParams(**params)
    return Req(
        rid="r",
        prompt_ids=tokens(prompt),
        params=p,
        sink=lambda d: None,
        detokenizer=IncrementalDetokenizer(CharTokenizer(), True),
        stop_matcher=StopStringMatcher.for_params(p),
    )


def feed(processor: OutputProcessor, req: Req, ids: list[int]) -> tuple[str | None, str]:
    """Process ``ids`` until one finishes ``req``; return (reason, all emitted text)."""
    text = ""
    for token_id in ids:
        reason = processor.process(req, token_id, None)
        text += processor.delta(req, reason).text
        if reason is not None:
            return reason, text
    return None, text


@pytest.mark.parametrize(
    "params, ids, reason, text",
    [
        ({"max_new_tokens": 10}, tokens("abc") + [EOS], "stop", "abc"),
        (
            {"max_new_tokens": 10, "ignore_eos": True},
            tokens("ab") + [EOS] + tokens("c"),
            None,
            "abc",
        ),
        ({"max_new_tokens": 3}, tokens("abcdef"), "length", "abc"),
        ({"max_new_tokens": 10, "stop_token_ids": [3]}, tokens("abcd"), "stop", "abc"),
        ({"max_new_tokens": 10, "stop": ["cd"]}, tokens("abcdef"), "stop", "ab"),
        ({"max_new_tokens": 10, "stop": ["zz"]}, tokens("abz"), None, "ab"),  # "z" is held back
        # issue #17: stop_regex stops and is trimmed; no_stop_trim keeps the match
        ({"stop_regex": "c+d"}, tokens("abccde"), "stop", "ab"),
        ({"stop_regex": ["q", "b[cd]"]}, tokens("abdef"), "stop", "a"),
        ({"stop_regex": "cd", "no_stop_trim": True}, tokens("abcdef"), "stop", "abcd"),
        ({"stop": ["cd"], "no_stop_trim": True}, tokens("abcdef"), "stop", "abcd"),
        ({"stop": ["de"], "stop_regex": "b."}, tokens("abcdef"), "stop", "a"),  # earliest wins
        ({"stop_regex": "zz"}, tokens("abcz"), None, "abc"),  # bounded: 1 char held back
        ({"stop_regex": "z+y"}, tokens("abc"), None, ""),  # unbounded: all held back
    ],
)
def test_finish_reasons_and_emitted_text(params, ids, reason, text):
    processor, _ = make()
    req = make_req(**params)
    assert feed(processor, req, ids) == (reason, text)


def test_the_context_length_ends_a_request():
    processor, _ = make(context_len=4)
    req = make_req("xy", max_new_tokens=10)
    assert feed(processor, req, tokens("abc")) == ("length", "ab")


def test_held_back_text_is_flushed_when_the_request_finishes():
    processor, _ = make()
    req = make_req(max_new_tokens=3, stop=["zz"])
    assert feed(processor, req, tokens("abz")) == ("length", "abz")


def test_deltas_carry_new_ids_logprobs_and_counts():
    processor, stats = make()
    req = make_req("xyz", max_new_tokens=5, logprobs=True)
    lp = TokenLogprob(1, -0.5, [])
    assert processor.process(req, 1, lp) is None
    assert stats.ttft.count == 1
    delta = processor.delta(req, None)
    assert (delta.text, delta.token_ids, delta.logprobs) == ("a", [1], [lp])
    assert (delta.prompt_tokens, delta.completion_tokens, delta.finished) == (3, 1, False)
    assert processor.delta(req, None).token_ids == []  # nothing new since
    abort = make_delta(req, "", [], "abort")
    assert abort.finished and abort.finish_reason == "abort" and abort.logprobs == []


def test_an_error_set_before_the_token_keeps_it_out():
    processor, _ = make()
    req = make_req()
    req.error = "grammar: too many states"
    assert processor.process(req, 1, None) is None and req.output_ids == []
    delta = error_delta(req, req.error)
    assert delta.finished and delta.finish_reason == "error" and delta.error == req.error


def test_stop_regex_held_back_text_is_flushed_at_the_end():
    processor, _ = make()
    req = make_req(max_new_tokens=3, stop_regex=r"z+y")
    assert feed(processor, req, tokens("abz")) == ("length", "abz")


def test_stop_regex_is_found_across_tokens_of_a_long_text():
    """A bounded pattern is searched from ``width - 1`` characters back: a match spanning the
    old and the new text is found however long the text grew."""
    processor, _ = make(context_len=1000)
    req = make_req(max_new_tokens=500, stop_regex=r"x\wy")
    ids = tokens("ab" * 100 + "xq") + tokens("yzz")
    assert feed(processor, req, ids) == ("stop", "ab" * 100)
    assert req.stop_matcher.matched(req.detokenizer.text) == r"x\wy"


class SplitCharTokenizer(CharTokenizer):
    """CharTokenizer plus token 27: the first byte of a two-byte character, "\ufffd" alone."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join("\ufffd" if i == 27 else CharTokenizer.decode(self, [i]) for i in ids)


def test_no_stop_matches_the_replacement_of_an_unfinished_character():
    """Cut off inside a character, the output ends with U+FFFD, but that is no text: a stop
    regex matching any non-word character does not cut there (the request ended by length)."""
    processor, _ = make()
    p = SamplingParams(max_new_tokens=3, stop_regex=[r"\W"])
    req = Req(
        rid="r",
        prompt_ids=tokens("xy"),
        params=p,
        sink=lambda d: None,
        detokenizer=IncrementalDetokenizer(SplitCharTokenizer(), True),
        stop_matcher=StopStringMatcher.for_params(p),
    )
    assert feed(processor, req, [1, 2, 27]) == ("length", "ab\ufffd")
