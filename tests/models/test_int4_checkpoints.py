"""4-bit AWQ and GPTQ folders (``radixgen/models/int4_checkpoints.py``): a tiny random Llama is
quantized and packed here, by this file's own packers written from the formats' definitions,
then loaded. Symmetric GPTQ must be the checkpoint's values bit for bit (Q4_0 blocks); AWQ and
asymmetric GPTQ within fp16 rounding of each group's offset (Q4_1 blocks); ``quantization=none``
exact; and the layouts this loader cannot keep exact are refused by name."""

from __future__ import annotations

import json

import pytest
import torch
from radixgen.kernels import QuantizedTensor
from safetensors.torch import save_file

from radixgen.model_runner import standalone_logits
from radixgen.models.loader import load_model

transformers = pytest.importorskip("transformers")

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's GEMM packing: nibble i <- output 8c + this


def _quantize(w: torch.Tensor, group: int, sym: bool):
    """Round ``w [out, in]`` to 4 bits per group of inputs (the last one shorter when ``group``
    does not divide the inputs): (q [out, in], s [out, G] fp16, z [out, G])."""
    qs, ss, zs = [], [], []
    for g in w.split(group, dim=1):
        if sym:
            s = (g.abs().amax(-1) / 7).clamp(min=1e-4).half()
            z = torch.full_like(s, 8, dtype=torch.int64)
        else:
            lo, hi = g.amin(-1), g.amax(-1)
            s = ((hi - lo) / 15).clamp(min=1e-4).half()
            z = (-lo / s.float()).round().clamp(0, 15).long()
        qs.append(((g / s.float()[:, None]).round() + z[:, None]).clamp(0, 15).long())
        ss.append(s)
        zs.append(z)
    return torch.cat(qs, 1), torch.stack(ss, 1), torch.stack(zs, 1)


def _expand(t: torch.Tensor, group: int, in_f: int) -> torch.Tensor:
    """Per-group values [out, G] -> per input [out, in]."""
    return t.repeat_interleave(group, 1)[:, :in_f]


def _pack_rows(nibbles: torch.Tensor) -> torch.Tensor:
    """[..., n*8] values 0..15 -> int32 [..., n], value 8c + i at bits 4i."""
    v = nibbles.view(*nibbles.shape[:-1], -1, 8).long()
    packed = sum(v[..., i] << (4 * i) for i in range(8))
    return (packed - ((packed >> 31) << 32)).to(torch.int32)  # as signed int32


def _awq_tensors(q, s, z):
    order = torch.tensor(AWQ_PACK_ORDER)
    qt = q.T.contiguous().view(q.shape[1], -1, 8)[..., order].reshape(q.shape[1], -1)  # [in, out]
    zt = z.T.contiguous().view(z.shape[1], -1, 8)[..., order].reshape(z.shape[1], -1)
    return {"qweight": _pack_rows(qt), "qzeros": _pack_rows(zt), "scales": s.T.contiguous()}


def _gptq_tensors(q, s, z, group, v1=True):
    qt = q.T.contiguous()  # [in, out]: packed along the inputs
    qweight = _pack_rows(qt.T.contiguous()).T.contiguous()  # [in / 8, out]
    stored = (z - 1) & 0xF if v1 else z  # the original format keeps z - 1
    return {
        "qweight": qweight,
        "qzeros": _pack_rows(stored.T.contiguous()),
        "scales": s.T.contiguous(),
        "g_idx": (torch.arange(q.shape[1]) // group).to(torch.int32),
    }


def _write(folder, tensors, quantization_config, config):
    folder.mkdir()
    raw = {**config.to_dict(), "architectures": ["LlamaForCausalLM"]}
    if quantization_config is not None:
        raw["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(raw))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(  # inputs of 128 and 256: one group of 128 fits
        vocab_size=320,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    state = transformers.LlamaForCausalLM(config).state_dict()
    state = {k: v for k, v in state.items() if k != "lm_head.weight"}  # tied
    return config, state, tmp_path_factory.mktemp("int4")


def _checkpoint(tiny, method: str, group: int, sym: bool, **extra):
    """(int4 folder, float folder of the checkpoint's exact values, {name: exact float W},
    {name: (q, s, z)})."""
    config, state, root = tiny
    packed, exact, parts = {}, {}, {}
    for name, w in state.items():
        layer = name.rsplit(".", 2)
        if len(layer) == 3 and layer[1] in LINEARS and layer[2] == "weight":
            q, s, z = _quantize(w, group, sym)
            parts[name] = (q, s, z)
            prefix = name[: -len("weight")]
            made = _awq_tensors(q, s, z) if method == "awq" else _gptq_tensors(q, s, z, group)
            packed.update({prefix + k: v for k, v in made.items()})
            in_f = q.shape[1]
            exact[name] = _expand(s.float(), group, in_f) * (q - _expand(z, group, in_f)).float()
        else:
            packed[name] = exact[name] = w
    qc = {"quant_method": method, "bits": 4, "group_size": group, **extra}
    if method == "awq":
        qc.update(zero_point=True, version="gemm")
    else:
        qc.update(sym=sym, desc_act=False)
    tag = f"{method}-{group}-{sym}-{len(list(root.iterdir()))}"
    int4 = _write(root / tag, packed, qc, config)
    ref = _write(root / (tag + "-float"), exact, None, config)
    return int4, ref, exact, parts


def _exact_qkv(exact, layer=0):
    attn = f"model.layers.{layer}.self_attn."
    return torch.cat([exact[attn + p + ".weight"] for p in ("q_proj", "k_proj", "v_proj")])


def _qkv_blocks(model) -> QuantizedTensor:
    weight = model.weights.layers[0].qkv.weight
    assert isinstance(weight, QuantizedTensor)
    return weight


CPU = torch.device("cpu")
IDS = [5, 17, 42, 99, 3, 250, 7, 8]


@pytest.mark.parametrize("group", [32, 96])  # 96: the last group of 128 or 256 inputs is shorter
def test_symmetric_gptq_is_q4_0_and_bit_exact(tiny, group):
    int4, ref, exact, _ = _checkpoint(tiny, "gptq", group, sym=True)
    model = load_model(int4, torch.float32, CPU)
    blocks = _qkv_blocks(model)
    assert blocks.fmt == "q4_0"
    reference = load_model(ref, torch.float32, CPU)
    # q, k, v rows: exactly the checkpoint's values
    assert torch.equal(blocks.dequantize(), _exact_qkv(exact))
    # float activations: the dequantized model's logits up to summation order
    got, expected = standalone_logits(model, IDS), standalone_logits(reference, IDS)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("method", "group"), [("awq", 32), ("awq", 128), ("gptq", 64)])
def test_asymmetric_checkpoints_are_q4_1_within_fp16_rounding_of_the_offset(tiny, method, group):
    int4, ref, exact, parts = _checkpoint(tiny, method, group, sym=False)
    model = load_model(int4, torch.float32, CPU)
    reference = load_model(ref, torch.float32, CPU)
    for i, layer in enumerate(model.weights.layers):
        got = layer.down.weight
        assert isinstance(got, QuantizedTensor) and got.fmt == "q4_1"
        name = f"model.layers.{i}.mlp.down_proj.weight"
        q, s, z = parts[name]
        offset = _expand(s.float() * z.float(), group, q.shape[1])
        bound = offset.abs() * 2**-11 + 1e-7  # half an fp16 ulp of s z, with room
        error = (got.dequantize() - exact[name]).abs()
        assert (error <= bound).all() and error.max() > 0  # rounded, and no more than that
    got, expected = standalone_logits(model, IDS), standalone_logits(reference, IDS)
    torch.testing.assert_close(got, expected, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(("method", "group"), [("awq", 32), ("gptq", 32), ("gptq", 96)])
def test_quantization_none_dequantizes_exactly(tiny, method, group):
    int4, ref, _, _ = _checkpoint(tiny, method, group, sym=False)
    model = load_model(int4, torch.float32, CPU, quantization="none")
    reference = load_model(ref, torch.float32, CPU)
    assert torch.equal(standalone_logits(model, IDS), standalone_logits(reference, IDS))


def test_gptq_v2_zeros_are_read_without_the_offset(tiny):
    config, state, root = tiny
    int4, _, exact, _ = _checkpoint(tiny, "gptq", 32, sym=True)
    # rewrite as gptq_v2: zeros stored as they are
    raw = json.loads((int4 / "config.json").read_text())
    raw["quantization_config"]["checkpoint_format"] = "gptq_v2"
    from safetensors.torch import load_file

    tensors = load_file(str(int4 / "model.safetensors"))
    for name in [n for n in tensors if n.endswith("qzeros")]:
        tensors[name] = torch.full_like(tensors[name], 0x88888888 - (1 << 32))  # every zero 8
    v2 = root / "gptq-v2"
    v2.mkdir()
    (v2 / "config.json").write_text(json.dumps(raw))
    save_file(tensors, str(v2 / "model.safetensors"))
    model = load_model(v2, torch.float32, CPU)
    assert _qkv_blocks(model).fmt == "q4_0"
    assert torch.equal(_qkv_blocks(model).dequantize(), _exact_qkv(exact))


def test_layouts_that_cannot_stay_exact_are_refused_by_name(tiny):
    int4, _, _, _ = _checkpoint(tiny, "gptq", 32, sym=True)
    from safetensors.torch import load_file

    tensors = load_file(str(int4 / "model.safetensors"))
    name = "model.layers.0.self_attn.q_proj.g_idx"
    tensors[name] = tensors[name].flip(0).contiguous()  # activation order
    folder = int4.parent / "desc-act"
    folder.mkdir()
    (folder / "config.json").write_text((int4 / "config.json").read_text())
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="desc_act"):
        load_model(folder, torch.float32, CPU)
    raw = json.loads((int4 / "config.json").read_text())
    for change, field in (
        ({"bits": 8}, "bits"),
        ({"quant_method": "bitsandbytes"}, "quant_method"),
        ({"group_size": 48}, "group_size"),
        ({"quant_method": "awq", "version": "gemv"}, "version"),
    ):
        bad = int4.parent / f"bad-{field}"
        bad.mkdir(exist_ok=True)
        (bad / "config.json").write_text(
            json.dumps({**raw, "quantization_config": {**raw["quantization_config"], **change}})
        )
        save_file(tensors, str(bad / "model.safetensors"))
        with pytest.raises(ValueError, match=f"quantization_config: .*{field}|{field}"):
            load_model(bad, torch.float32, CPU)


def test_the_awq_layout_is_the_one_sglangs_reference_reads():
    """This file's AWQ packer against an outside reader (SGLang's CPU test reference, which
    dequantizes through bfloat16): a wrong nibble order would be off by whole steps."""
    cpu_test_utils = pytest.importorskip("sglang.test.cpu_test_utils")
    torch.manual_seed(1)
    w = torch.randn(64, 128)
    q, s, z = _quantize(w, 32, sym=False)
    t = _awq_tensors(q, s, z)
    theirs, _ = cpu_test_utils.unpack_and_dequant_awq(
        t["qweight"], t["qzeros"], t["scales"], bits=4, group_size=32
    )
    ours = load_int4_layer("awq", t)
    # theirs rounds s z to bfloat16 (up to ~0.012 here); one misplaced nibble moves a weight by
    # a whole step s (> 0.15 here)
    assert float(s.float().min()) > 0.15
    assert (theirs.float() - ours).abs().max() < 0.02


def test_the_gptq_layout_is_the_one_sglangs_reference_reads():
    """This file's GPTQ packer against SGLang's unpacker (inputs packed along qweight's rows,
    outputs along qzeros' columns; the original format stores each zero minus one)."""
    cpu_test_utils = pytest.importorskip("sglang.test.cpu_test_utils")
    torch.manual_seed(2)
    q, s, z = _quantize(torch.randn(64, 128), 32, sym=False)
    t = _gptq_tensors(q, s, z, 32)
    q_theirs, z_theirs = cpu_test_utils.unpack_4bit_to_32bit_signed(t["qweight"], t["qzeros"])
    assert torch.equal(q_theirs.long().T, q)  # theirs is [in, out]
    assert torch.equal(z_theirs.long().T, z)  # they add the one back, as the loader does
    exact = _expand(s.float(), 32, 128) * (q - _expand(z, 32, 128)).float()
    assert torch.equal(load_int4_layer("gptq", t), exact)


def load_int4_layer(method: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
    """One layer's exact float weight through the loader's getter."""
    from radixgen.models.int4_checkpoints import Int4Format, int4_getter

    fmt = Int4Format(method, 32, 1 if method == "gptq" else 0)
    get = int4_getter(lambda n: tensors.get(n.removeprefix("x.")), fmt, keep_blocks=False)
    return get("x.weight")
