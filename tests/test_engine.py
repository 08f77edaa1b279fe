"""Engine on the default model: batching, streaming, stops, seeds, logprobs, aborts, bad input."""

from __future__ import annotations

import threading

import pytest
import torch

from radixgen import SamplingParams

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)

PROMPTS = [
    "Hi",
    "The three primary colors are",
    "Write a long story about a dragon who learns to paint. Once upon a time, in a valley far away,",
    "1, 2, 3, 4,",
    "Q: What is the boiling point of water at sea level in Celsius?\nA:",
    "import numpy as np\n\ndef normalize(v):",
    "Les chats sont",
    "A list of fruits: apple, banana,",
]


def test_batch_invariance(engine):
    together = engine.generate(PROMPTS, GREEDY)
    alone = [engine.generate(p, GREEDY)[0] for p in PROMPTS]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    engine.check_integrity()


def test_output_fields(engine):
    out = engine.generate(
        "The capital of France is",
        SamplingParams(max_new_tokens=5, temperature=0.0, ignore_eos=True),
    )[0]
    assert out.finish_reason == "length" and out.completion_tokens == 5 == len(out.token_ids)
    assert out.prompt_tokens == len(engine.tokenizer.encode("The capital of France is"))
    assert out.text == engine.tokenizer.decode(out.token_ids)


def test_sampling_params_may_be_a_dict(engine):
    """SGLang's Engine.generate takes sampling params as a dict: the same fields, the same text."""
    fields = {"max_new_tokens": 6, "temperature": 0.0, "stop": ["\n\n"]}
    want = engine.generate("The three primary colors are", SamplingParams(**fields))[0]
    got = engine.generate(["The three primary colors are"] * 2, [fields, dict(fields)])
    assert [o.token_ids for o in got] == [want.token_ids] * 2
    assert engine.chat([{"role": "user", "content": "Hi"}], fields).completion_tokens <= 6
    assert (
        "".join(d.text for d in engine.stream("Hi", fields))
        == engine.generate("Hi", fields)[0].text
    )
    with pytest.raises(ValueError, match="unknown field.*max_tokens"):
        engine.generate("Hi", {"max_tokens": 5})
    with pytest.raises(ValueError, match="params: expected SamplingParams or a dict"):
        engine.generate("Hi", 0.5)  # type: ignore[arg-type]


def test_stream_deltas_join_to_final_text(engine):
    params = SamplingParams(max_new_tokens=40, temperature=0.0)
    deltas = list(
        engine.stream([{"role": "user", "content": "Say something with an emoji 🎉"}], params)
    )
    final = engine.chat([{"role": "user", "content": "Say something with an emoji 🎉"}], params)
    assert "".join(d.text for d in deltas) == final.text
    assert sum(d.finished for d in deltas) == 1 and deltas[-1].finished
    # no delta splits a character; an output cut inside one (here: 40 tokens into an emoji)
    # ends with U+FFFD, the decode of its tokens
    assert all("\ufffd" not in d.text for d in deltas[:-1])
    assert final.text == engine.tokenizer.decode(final.token_ids)


def test_stop_string_cuts_output_exactly(engine):
    base = engine.generate("1, 2, 3, 4,", SamplingParams(max_new_tokens=20, temperature=0.0))[
        0
    ].text
    stop = base.strip().split(",")[1].strip()  # a number the model is about to write
    assert stop
    out = engine.generate(
        "1, 2, 3, 4,", SamplingParams(max_new_tokens=20, temperature=0.0, stop=[stop])
    )[0]
    assert out.finish_reason == "stop"
    assert out.text == base[: base.index(stop)]
    streamed = "".join(
        d.text
        for d in engine.stream(
            "1, 2, 3, 4,", SamplingParams(max_new_tokens=20, temperature=0.0, stop=[stop])
        )
    )
    assert streamed == out.text


def test_stop_token_ids(engine):
    base = engine.generate("1, 2, 3, 4,", SamplingParams(max_new_tokens=8, temperature=0.0))[0]
    stop_id = base.token_ids[2]
    out = engine.generate(
        "1, 2, 3, 4,", SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=[stop_id])
    )[0]
    assert out.finish_reason == "stop" and out.token_ids == base.token_ids[:3]


def test_seed_reproducible_regardless_of_batch_mates(engine):
    params = SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, seed=1234)
    alone = engine.generate("Once upon a time", params)[0].token_ids
    mates = [SamplingParams(max_new_tokens=16, temperature=1.0)] * 3
    batch = engine.generate(
        ["Hello there", "Once upon a time", "A poem:", "Numbers:"], [mates[0], params, *mates[1:]]
    )
    assert batch[1].token_ids == alone
    other = engine.generate(
        "Once upon a time", SamplingParams(max_new_tokens=16, temperature=1.0, top_p=0.95, seed=99)
    )[0]
    assert other.token_ids != alone


def test_logprobs(engine):
    out = engine.generate(
        "The sky is",
        SamplingParams(max_new_tokens=4, temperature=0.0, logprobs=True, top_logprobs=3),
    )[0]
    assert len(out.logprobs) == 4
    for token_id, lp in zip(out.token_ids, out.logprobs):
        assert lp.token_id == token_id and lp.logprob <= 0.0
        assert lp.top[0][0] == token_id  # greedy picks the top token
        assert [v for _, v in lp.top] == sorted((v for _, v in lp.top), reverse=True)


def test_logit_bias_forces_a_token(engine):
    target = engine.tokenizer.encode(" banana")[0]
    out = engine.generate(
        "My favourite word is",
        SamplingParams(max_new_tokens=2, temperature=0.0, logit_bias={target: 100.0}),
    )[0]
    assert out.token_ids[0] == target


def test_repetition_penalty_changes_greedy_output(engine):
    prompt = "la la la la la la la la"
    plain = engine.generate(prompt, SamplingParams(max_new_tokens=8, temperature=0.0))[0]
    penalized = engine.generate(
        prompt, SamplingParams(max_new_tokens=8, temperature=0.0, repetition_penalty=2.0)
    )[0]
    assert plain.token_ids != penalized.token_ids


def test_abort_frees_everything(engine):
    rid_done = threading.Event()
    deltas = []

    def sink(delta):
        deltas.append(delta)
        if delta.finished:
            rid_done.set()

    rid = engine.add_request(
        "Tell me a very long story.", SamplingParams(max_new_tokens=2000, ignore_eos=True), sink
    )
    while not deltas:
        threading.Event().wait(0.05)
    engine.abort(rid)
    assert rid_done.wait(30)
    assert deltas[-1].finish_reason == "abort"
    engine.check_integrity()
    assert engine.stats()["running"] == 0


def test_closing_a_stream_aborts(engine):
    stream = engine.stream(
        "Count to one thousand:", SamplingParams(max_new_tokens=500, ignore_eos=True)
    )
    next(stream)
    stream.close()
    engine.call(lambda: None)  # let the abort command run
    engine.check_integrity()


@pytest.mark.parametrize(
    ("prompt", "params", "message"),
    [
        ("", SamplingParams(), "prompt: must not be empty"),
        ([], SamplingParams(), "prompt"),
        ("word " * 9000, SamplingParams(), "longer than the context"),
        ("hi", SamplingParams(max_new_tokens=0), "max_new_tokens"),
        ("hi", SamplingParams(temperature=-1.0), "temperature"),
        ("hi", SamplingParams(top_p=0.0), "top_p"),
        ("hi", SamplingParams(regex="a", choices=["a"]), "at most one constraint"),
        ([1, 2, 10**9], SamplingParams(), "outside the vocabulary"),
    ],
)
def test_bad_input_is_a_clear_value_error(engine, prompt, params, message):
    with pytest.raises(ValueError, match=message):
        engine.generate(prompt, params) if prompt != [] else engine.add_request(prompt, params)


def test_unknown_model_path():
    from radixgen import Engine

    with pytest.raises(ValueError, match="neither an existing .gguf file"):
        Engine("/nonexistent/model.gguf")


def test_unknown_engine_option():
    from radixgen import Engine

    with pytest.raises(ValueError, match="unknown option"):
        Engine(max_total_token=5)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"quant_activations": "q8", "quantization": "none"}, "quant_activations: q8 rounds"),
        ({"cpu_amx": "on", "quant_activations": "q8"}, "cpu_amx: on multiplies float"),
        ({"cpu_amx": "always"}, "cpu_amx: expected"),
        ({"cpu_amx": "on", "quantization": "none"}, "cpu_amx: on multiplies weights in blocks"),
        ({"max_total_tokens": 10**11}, "max_total_tokens: a KV pool of .* does not fit"),
        (  # oneDNN's float GEMM picks its kernel by the row count
            {"enable_deterministic_inference": True, "quantization": "none"},
            "enable_deterministic_inference: batch-invariant matmuls are the C kernels on blocks",
        ),
    ],
)
def test_options_that_cannot_take_effect_are_refused(default_model_path, options, message):
    """Never silently weaker: 8-bit activations with no blocks to multiply, or a pool larger
    than the memory it would fill, are errors naming the option."""
    from radixgen import Engine

    with pytest.raises(ValueError, match=message):
        Engine(str(default_model_path), **options)


def test_cpu_amx_on_is_refused_where_the_tiles_are_missing(default_model_path, monkeypatch):
    """``cpu_amx="on"`` is a requirement: without AMX tiles it is an error naming the option,
    not the packed float path in its place."""
    from radixgen import Engine
    from radixgen.models import loader

    monkeypatch.setattr(loader, "amx_available", lambda: False)
    with pytest.raises(ValueError, match="cpu_amx: on needs AMX tiles"):
        Engine(str(default_model_path), cpu_amx="on")


def test_the_default_cpu_pool_is_a_share_of_ram(monkeypatch):
    """Issue #53: the default CPU pool is bounded by 0.1 of available RAM (at most 4 GiB), as
    before stop 47; it is resident only as used and shrinks when idle (next test).
    --kv-memory-fraction takes another share."""
    from radixgen.engine import _default_pool_tokens

    cpu, per_token = torch.device("cpu"), 46_080  # SmolLM2-135M, float32
    monkeypatch.setattr("radixgen.engine._available_ram", lambda: 20 << 30)
    tokens, how = _default_pool_tokens(per_token, cpu, None)
    assert tokens == (2 << 30) // per_token and how == "0.1 of 20.0 GiB available RAM"
    assert _default_pool_tokens(per_token, cpu, 0.05)[0] == (1 << 30) // per_token
    tokens, how = _default_pool_tokens(per_token, cpu, 0.5)
    assert tokens == (4 << 30) // per_token and how.endswith("capped at 4 GiB")
    monkeypatch.setattr("radixgen.engine._available_ram", lambda: 1 << 30)  # RAM is short
    assert _default_pool_tokens(per_token, cpu, None)[0] == 2330  # 0.1 GiB
    assert _default_pool_tokens(4, cpu, None)[0] == 1 << 18  # at most 256k tokens


def test_an_idle_engine_shrinks_its_default_cpu_pool(tiny_model_folder, monkeypatch):
    """Issue #53: idle IDLE_SHRINK_S, an engine whose CPU pool was sized by default evicts the
    cached prefixes past the idle size (least recently used first), releases the pages of free
    slots but a reserve, and serves on with the same outputs; an explicit size never shrinks."""
    import time

    from radixgen import Engine

    monkeypatch.setattr("radixgen.engine.IDLE_TRIM_S", 0.05)
    monkeypatch.setattr("radixgen.engine.IDLE_SHRINK_S", 0.3)
    monkeypatch.setattr("radixgen.engine.CPU_POOL_MIN_TOKENS", 1024)
    eng = Engine(str(tiny_model_folder), context_length=1024)
    try:
        stats = eng.stats()
        assert stats["kv_pool_idle_tokens"] == 1024 < stats["max_total_tokens"]
        assert "1024 tokens once idle" in stats["kv_pool_sizing"]
        prompts = [f"Prompt {i}: " + "word " * 150 for i in range(16)]
        first = [o.text for o in eng.generate(prompts, GREEDY)]
        assert eng.stats()["tokens_in_tree"] > 2048
        deadline = time.monotonic() + 10
        while eng.stats()["kv_pool_shrinks"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        stats = eng.stats()
        assert stats["kv_pool_shrinks"] == 1
        # the reserve (WARM_AHEAD_BYTES, here more than the idle size): half the idle size
        assert 0 < stats["tokens_in_tree"] <= 1024 - 512
        assert eng.kv.allocator.num_warm_free == 512
        assert [o.text for o in eng.generate(prompts, GREEDY)] == first
        assert eng.stats()["kv_pool_shrinks"] == 1  # not again until idle again
    finally:
        eng.shutdown()
    fixed = Engine(str(tiny_model_folder), context_length=1024, max_total_tokens=4096)
    try:
        assert fixed.stats()["kv_pool_idle_tokens"] == 0
    finally:
        fixed.shutdown()


def test_an_idle_engine_gives_freed_heap_back_once(tiny_model_folder, monkeypatch):
    """After loading and after each burst the engine trims the heap once it has been idle
    IDLE_TRIM_S (glibc keeps freed pages: ~340 MB after 64 JSON-schema streams on the default
    model, ~40 MB after loading it), and not again until it has stepped."""
    import time

    from radixgen import Engine

    trims: list[float] = []
    monkeypatch.setattr("radixgen.engine.IDLE_TRIM_S", 0.2)
    monkeypatch.setattr("radixgen.engine.release_free_memory", lambda: trims.append(1.0))
    eng = Engine(str(tiny_model_folder), max_total_tokens=1024)
    try:
        time.sleep(0.8)
        assert trims == [1.0]  # what loading freed
        time.sleep(0.5)
        assert trims == [1.0]  # idle still: no second trim
        eng.generate("Hi", GREEDY)
        time.sleep(0.8)
        assert len(trims) == 2
    finally:
        eng.shutdown()
