"""Tiny random-weight Llama-family models: our safetensors loader + forward match transformers."""

from __future__ import annotations

import pytest
import torch

from radixgen.forward_batch import ForwardBatch
from radixgen.mem_cache.memory_pool import KVPool, ReqToTokenPool
from radixgen.models.loader import load_model

transformers = pytest.importorskip("transformers")

BASE = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)

CONFIGS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=False)),
    "llama3-rope-scaling": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            num_key_value_heads=1,
            tie_word_embeddings=True,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        dict(num_key_value_heads=1, sliding_window=None),
    ),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=False)),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model_pair(request, tmp_path_factory):
    config_cls, model_cls, extra = CONFIGS[request.param]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**{**BASE, **extra})
    hf = getattr(transformers, model_cls)(config).eval()
    if request.param == "qwen2":  # give the q/k/v biases non-zero values so they are exercised
        with torch.no_grad():
            for layer in hf.model.layers:
                for proj in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                ):
                    proj.bias.normal_(0, 0.5)
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder, safe_serialization=True)
    return hf, load_model(folder, torch.float32, torch.device("cpu"))


def _batch(model, pool, table, rows, starts, ids_per_req):
    """ForwardBatch extending each request ``rows[i]`` from ``starts[i]`` with ``ids_per_req[i]``."""
    input_ids = [t for ids in ids_per_req for t in ids]
    positions = [p for s, ids in zip(starts, ids_per_req) for p in range(s, s + len(ids))]
    out_slots = torch.cat(
        [table.table[r, s : s + len(ids)] for r, s, ids in zip(rows, starts, ids_per_req)]
    ).long()
    lens = torch.tensor([len(ids) for ids in ids_per_req])
    prefix = torch.tensor(starts)
    last = torch.cumsum(lens, 0) - 1
    num_decode = next((i for i, n in enumerate(lens.tolist()) if n != 1), len(rows))
    return ForwardBatch(
        input_ids=torch.tensor(input_ids),
        positions=torch.tensor(positions),
        out_slots=out_slots,
        req_pool_indices=torch.tensor(rows),
        prefix_lens=prefix,
        extend_lens=lens,
        seq_lens=prefix + lens,
        logits_indices=last,
        num_decode=num_decode,
        kv_pool=pool,
        req_to_token=table.table,
    )


def test_prefill_chunked_extend_and_decode_match(model_pair):
    hf, ours = model_pair
    cfg = ours.config
    torch.manual_seed(1)
    seqs = [torch.randint(0, cfg.vocab_size, (n,)).tolist() for n in (13, 40, 7)]
    pool = KVPool(256, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, torch.float32, "cpu")
    table = ReqToTokenPool(4, 128, "cpu")
    next_slot = 1
    for row, seq in enumerate(seqs):
        table.write(row, 0, torch.arange(next_slot, next_slot + len(seq) + 1))
        next_slot += len(seq) + 1
    # step 1: request 0 prefills whole, request 1 its first 25 tokens, request 2 all but one token
    ours.forward(
        _batch(ours, pool, table, [0, 1, 2], [0, 0, 0], [seqs[0], seqs[1][:25], seqs[2][:-1]])
    )
    # step 2 (mixed): request 2 decodes its last token, request 1 extends its remaining 15 after a cached prefix
    logits = ours.forward(
        _batch(ours, pool, table, [2, 1], [len(seqs[2]) - 1, 25], [seqs[2][-1:], seqs[1][25:]])
    )
    with torch.no_grad():
        ref2 = hf(torch.tensor([seqs[2]])).logits[0, -1]
        ref1 = hf(torch.tensor([seqs[1]])).logits[0, -1]
    torch.testing.assert_close(logits[0], ref2, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits[1], ref1, atol=1e-4, rtol=1e-4)
