"""Multi-LoRA serving through the engine: adapters made by ``peft`` give peft's greedy outputs,
several adapters (and the base model) batched in one step, on a float model and on the default
GGUF model's quantized blocks; adapters never share cached prefixes; bad adapters and names are
refused by name while the engine serves on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lora_adapters import make_adapter, tiny_adapters

from radixgen import Engine, SamplingParams

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

PROMPTS = [[1, 450, 2000, 31, 777, 9, 12000, 5], [3, 88, 4096, 250, 11, 6], [7, 7, 900, 1234, 42]]
NEW = 10


def peft_greedy(
    base_folder: Path, adapter: Path | None, prompt: list[int], new: int = NEW
) -> list[int]:
    base = transformers.AutoModelForCausalLM.from_pretrained(base_folder, torch_dtype=torch.float32)
    model = base if adapter is None else peft.PeftModel.from_pretrained(base, adapter)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=new, do_sample=False, min_new_tokens=new
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def adapters(tiny_model_folder, tmp_path_factory):
    return tiny_adapters(tiny_model_folder, tmp_path_factory.mktemp("loras"))


@pytest.fixture(scope="module")
def lora_engine(tiny_model_folder, adapters):
    engine = Engine(
        str(tiny_model_folder),
        lora_paths=[f"a={adapters['a']}", f"b={adapters['b']}"],
        max_total_tokens=4096,
    )
    yield engine
    engine.shutdown()


def greedy(lora: str | None, new: int = NEW) -> SamplingParams:
    return SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True, lora_path=lora)


def test_batched_adapters_give_peft_outputs(lora_engine, tiny_model_folder, adapters):
    names = ["a", "b", None]
    outs = lora_engine.generate(PROMPTS, [greedy(n) for n in names])  # one batch, three models
    want = [
        peft_greedy(tiny_model_folder, adapters[n] if n else None, p)
        for n, p in zip(names, PROMPTS)
    ]
    assert [o.token_ids for o in outs] == want
    # the adapters change the outputs (so the comparison above could fail)
    base = lora_engine.generate(PROMPTS[:2], greedy(None))
    assert base[0].token_ids != outs[0].token_ids and base[1].token_ids != outs[1].token_ids


def test_one_prompt_on_every_adapter_in_one_batch(lora_engine):
    prompt = PROMPTS[0]
    together = lora_engine.generate([prompt] * 3, [greedy("a"), greedy(None), greedy("b")])
    alone = [lora_engine.generate([prompt], greedy(n))[0] for n in ("a", None, "b")]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert len({tuple(o.token_ids) for o in together}) == 3


def test_adapters_never_share_cached_prefixes(lora_engine):
    prompt = [5, *range(1000, 1100)]
    first_a = lora_engine.generate([prompt], greedy("a", 2))[0]
    on_b = lora_engine.generate([prompt], greedy("b", 2))[0]
    on_base = lora_engine.generate([prompt], greedy(None, 2))[0]
    again_a = lora_engine.generate([prompt], greedy("a", 2))[0]
    assert (first_a.cached_tokens, on_b.cached_tokens, on_base.cached_tokens) == (0, 0, 0)
    assert again_a.cached_tokens == len(prompt) - 1


def test_max_loras_per_batch_queues_the_others(tiny_model_folder, adapters, lora_engine):
    engine = Engine(
        str(tiny_model_folder),
        lora_paths=[f"a={adapters['a']}", f"b={adapters['b']}"],
        max_loras_per_batch=1,
    )
    try:
        outs = engine.generate(PROMPTS, [greedy("a"), greedy("b"), greedy("a")])
    finally:
        engine.shutdown()
    want = lora_engine.generate(PROMPTS, [greedy("a"), greedy("b"), greedy("a")])
    assert [o.token_ids for o in outs] == [o.token_ids for o in want]


def test_adapters_load_and_unload_at_run_time(tiny_model_folder, adapters, lora_engine):
    engine = Engine(str(tiny_model_folder), enable_lora=True)
    try:
        with pytest.raises(ValueError, match="lora_path: no adapter named 'a' is loaded"):
            engine.generate(PROMPTS[:1], greedy("a"))
        loaded = engine.load_lora_adapter("a", str(adapters["a"]))
        assert loaded.rank == 8 and engine.stats()["lora_adapters"] == ["a"]
        got = engine.generate(PROMPTS[:1], greedy("a"))[0].token_ids
        assert got == lora_engine.generate(PROMPTS[:1], greedy("a"))[0].token_ids
        with pytest.raises(ValueError, match="lora_name: an adapter named 'a' is loaded already"):
            engine.load_lora_adapter("a", str(adapters["b"]))
        engine.unload_lora_adapter("a")
        with pytest.raises(ValueError, match="lora_path: no adapter named 'a' is loaded"):
            engine.generate(PROMPTS[:1], greedy("a"))
        with pytest.raises(ValueError, match="lora_name: no adapter named 'a' is loaded"):
            engine.unload_lora_adapter("a")
        # a new adapter under the old name is a new namespace: nothing cached is reused
        engine.load_lora_adapter("a", str(adapters["b"]))
        out = engine.generate(PROMPTS[:1], greedy("a"))[0]
        assert out.cached_tokens == 0
    finally:
        engine.shutdown()


def test_bad_adapters_are_refused_by_name(tiny_model_folder, adapters, tmp_path):
    engine = Engine(str(tiny_model_folder), enable_lora=True, max_lora_rank=4)
    try:
        with pytest.raises(ValueError, match=r"lora_path: '/nowhere' is not a folder"):
            engine.load_lora_adapter("x", "/nowhere")
        with pytest.raises(ValueError, match=r"lora_path: .* has rank 8, over --max-lora-rank 4"):
            engine.load_lora_adapter("x", str(adapters["a"]))
        other = tmp_path / "other-base"
        other.mkdir()
        (other / "adapter_config.json").write_text(
            json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2})
        )
        from safetensors.torch import save_file

        key = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
        save_file(
            {key.format("A"): torch.zeros(2, 2048), key.format("B"): torch.zeros(64, 2)},
            str(other / "adapter_model.safetensors"),
        )
        with pytest.raises(ValueError, match=r"this model needs \[2, 64\] .* another base model"):
            engine.load_lora_adapter("x", str(other))
        (other / "adapter_config.json").write_text(
            json.dumps({"peft_type": "LORA", "r": 2, "use_dora": True})
        )
        with pytest.raises(ValueError, match="uses DoRA, which radixgen does not apply"):
            engine.load_lora_adapter("x", str(other))
        # the engine serves on
        assert engine.generate(PROMPTS[:1], greedy(None, 2))[0].token_ids
    finally:
        engine.shutdown()
    with pytest.raises(ValueError, match="lora_paths: '/nowhere' is not a folder"):
        Engine(str(tiny_model_folder), lora_paths=["x=/nowhere"])
    plain = Engine(str(tiny_model_folder))
    try:
        with pytest.raises(ValueError, match="lora_path: this server serves no adapters"):
            plain.generate(PROMPTS[:1], greedy("a"))
    finally:
        plain.shutdown()


def test_adapters_on_the_default_gguf_models_blocks(hf_gguf_model, tmp_path, default_model_path):
    """The default model keeps its Q4_1 blocks; the adapter's delta goes on top and the greedy
    outputs are peft's on the dequantized model (transformers' GGUF loader)."""
    adapter = make_adapter(
        hf_gguf_model,
        tmp_path / "smol",
        3,
        r=8,
        lora_alpha=16,
        target_modules=["q_proj", "v_proj", "o_proj", "down_proj"],
    )
    engine = Engine(str(default_model_path), lora_paths=[f"smol={adapter}"], max_total_tokens=4096)
    try:
        assert "q4_1" in engine.model.weights_summary()
        prompt = engine.tokenizer.encode("The capital of France is")
        outs = engine.generate([prompt, prompt], [greedy("smol", 12), greedy(None, 12)])
    finally:
        engine.shutdown()
    model = peft.PeftModel.from_pretrained(hf_gguf_model, adapter).eval()
    with torch.no_grad():
        want = model.generate(
            torch.tensor([prompt]), max_new_tokens=12, do_sample=False, min_new_tokens=12
        )
    model.unload()
    assert outs[0].token_ids == want[0, len(prompt) :].tolist()
    assert outs[0].token_ids != outs[1].token_ids


def test_prompt_lookup_drafts_are_verified_on_each_adapter(
    tiny_model_folder, adapters, lora_engine
):
    """ngram speculation: the drafts are checked by the request's own adapter, so the outputs
    are those without speculation."""
    engine = Engine(
        str(tiny_model_folder),
        lora_paths=[f"a={adapters['a']}", f"b={adapters['b']}"],
        speculative_algorithm="ngram",
    )
    prompts = [p * 4 for p in PROMPTS]  # repetitive: prompt lookup finds drafts
    names = ["a", "b", None]
    try:
        got = engine.generate(prompts, [greedy(n, 24) for n in names])
        stats = engine.stats()
    finally:
        engine.shutdown()
    want = lora_engine.generate(prompts, [greedy(n, 24) for n in names])
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert stats["spec_draft_tokens"] > 0
