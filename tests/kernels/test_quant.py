"""Block-quantized matmuls (kernels/quant.py) against the dequantize-then-float32 reference.

Weights of the formats radixgen makes (Q8_0, Q4_0, Q4_1) come from the reference quantizer; the
K-quants (Q4_K, Q5_K, Q6_K) from random blocks (every bit pattern of their quants is a valid
weight). Shapes are odd on purpose: an odd number of blocks per row (the packed layout pairs
blocks and pads its scales to 8), 1..64 activation rows, output counts that are not a multiple
of the kernels' tile.
"""

from __future__ import annotations

import threading

import pytest
import torch
from radixgen.kernels import quant as Q

pytestmark = pytest.mark.usefixtures("native_env")


@pytest.fixture(scope="module")
def lib():
    lib = Q.quant_c_library()
    if lib is None:
        pytest.skip("the native CPU kernels did not build")
    return lib


def _weight(fmt: str, out: int, inputs: int, seed: int = 0) -> Q.QuantizedTensor:
    g = torch.Generator().manual_seed(seed)
    if fmt in Q.QUANTIZABLE:
        return Q.quantize(torch.randn(out, inputs, generator=g), fmt)
    return Q._random_blocks(fmt, out, inputs, g)


def _widths(fmt: str) -> list[int]:
    block = Q.FORMATS[fmt][1]
    return [block, 3 * block] if block == 256 else [32, 96, 19 * 32, 608]


@pytest.mark.parametrize("fmt", list(Q.FORMATS))
@pytest.mark.parametrize("rows", [1, 2, 3, 17, 64])
def test_float_activations_match_the_reference(lib, fmt, rows):
    for inputs in _widths(fmt):
        w = _weight(fmt, 37, inputs)
        x = torch.randn(rows, inputs)
        want = Q.quant_matmul_ref(x, w)
        got = Q.quant_matmul_c(lib, x, w, None, "f32")
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 17, 64])
def test_eight_bit_activations_stay_within_their_rounding(lib, fmt, rows):
    for inputs in _widths(fmt):
        w = _weight(fmt, 37, inputs).to_packed()
        x = torch.randn(rows, inputs)
        want = Q.quant_matmul_ref(x, Q.QuantizedTensor(_weight(fmt, 37, inputs).data, fmt, inputs))
        got = Q.quant_matmul_c(lib, x, w, None, "q8")
        # x rounded to 8 bits per block: |error| <= sum |w| * d_x / 2, a few tenths of a percent
        # of the largest output on Gaussian data
        assert (got - want).abs().max() <= 0.02 * want.abs().max()
        # and the packed float path is the reference up to summation order
        exact = Q.quant_matmul_c(lib, x, w, None, "f32")
        torch.testing.assert_close(exact, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
def test_packed_layout_holds_the_same_values(lib, fmt):
    for inputs in _widths(fmt):
        w = _weight(fmt, 21, inputs)
        packed = w.to_packed()
        assert packed.data.shape[1] == Q.row_bytes(fmt, inputs, packed=True)
        assert torch.equal(packed.dequantize(), Q.dequantize_ref(w))


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
def test_a_row_does_not_depend_on_its_batch(lib, fmt):
    """Prefill and decode, cached prefix or not, compute a token alike: the 8-bit path gives a
    row the same bits alone, in a batch, at any position in it."""
    w = _weight(fmt, 101, 19 * 32).to_packed()
    x = torch.randn(40, 19 * 32)
    together = Q.quant_matmul_c(lib, x, w, None, "q8")
    for i in (0, 1, 7, 39):
        assert torch.equal(Q.quant_matmul_c(lib, x[i : i + 1], w, None, "q8")[0], together[i])
    assert torch.equal(Q.quant_matmul_c(lib, x[3:8], w, None, "q8"), together[3:8])


@pytest.fixture(scope="module")
def interleaving(lib):
    if not lib.quant_interleave_supported():
        pytest.skip("the C build has no AVX-512 VNNI (the interleaved layout)")
    return lib


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
@pytest.mark.parametrize("layout", ["interleaved", "tiled"])
def test_grouped_layouts_hold_the_same_values(lib, layout, fmt):
    """The two layouts of 16 rows' blocks side by side keep GGUF's bytes per row and every
    value; rows (an embedding lookup) come back from any group, either side of the seams. 50
    blocks: more than one chunk of the tiled path's B operands."""
    supported = (
        lib.quant_interleave_supported if layout == "interleaved" else lib.quant_tile_supported
    )
    if not supported():
        pytest.skip(f"no {layout} layout in this build or on this CPU")
    relayout = Q._interleave_c if layout == "interleaved" else Q._tile_c
    for inputs in (*_widths(fmt), 50 * 32):
        w = _weight(fmt, 48, inputs)
        grouped = relayout(lib, w)
        assert getattr(grouped, layout) and grouped.data.shape == w.data.shape
        assert grouped.layout == Q.LAYOUTS.index(layout)
        assert torch.equal(grouped.dequantize(), Q.dequantize_ref(w))
        ids = torch.tensor([47, 0, 17, 16, 31])
        assert torch.equal(Q.embedding(ids, grouped), Q.dequantize_ref(w)[ids])


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9, 17, 64])
def test_interleaved_eight_bit_activations_stay_within_their_rounding(interleaving, fmt, rows):
    """The same integer products as the packed 8-bit path, scaled per block in another order:
    within the activations' rounding of the reference, and within float noise of the packed
    path."""
    for inputs in _widths(fmt):
        w = _weight(fmt, 32, inputs)
        x = torch.randn(rows, inputs)
        bias = torch.randn(32)
        want = Q.quant_matmul_ref(x, w, bias)
        got = Q.quant_matmul_c(interleaving, x, Q._interleave_c(interleaving, w), bias, "q8")
        assert (got - want).abs().max() <= 0.02 * want.abs().max()
        packed = Q.quant_matmul_c(interleaving, x, w.to_packed(), bias, "q8")
        torch.testing.assert_close(got, packed, rtol=1e-5, atol=1e-5 * want.abs().max().item())


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
def test_an_interleaved_row_does_not_depend_on_its_batch(interleaving, fmt):
    """Every row count takes its own tile (1-8 rows, several chunks beyond): a row's bits are
    the same alone, among any number of rows and at any place among them."""
    _assert_batch_free(
        interleaving, Q._interleave_c(interleaving, _weight(fmt, 64, 19 * 32)), "q8", 17
    )


def _assert_batch_free(lib, w: Q.QuantizedTensor, act: str, most: int) -> None:
    """Rows 3.. of a 3 + most + 2 row call have the same bits in calls of 1..most rows."""
    bias = torch.randn(w.out_features)
    x = torch.randn(most + 5, w.in_features)
    together = Q.quant_matmul_c(lib, x, w, bias, act)
    for n in range(1, most + 1):
        part = Q.quant_matmul_c(lib, x[3 : 3 + n], w, bias, act)
        assert torch.equal(part, together[3 : 3 + n]), n


def _q8_emulated(x: torch.Tensor, w: Q.QuantizedTensor) -> torch.Tensor:
    """The 8-bit-activation product in float64 from its definition: x rounded per block of 32
    (d = max|x| / 127 in float32, q = x * (127 / max|x|) rounded half to even), each block's
    exact integer dot product with the weight's quants, times both scales, plus the weight's
    offset (Q4_1's minimum; -8 d for Q4_0, none for Q8_0) times d * sum(q)."""
    _, _, nbytes = Q.FORMATS[w.fmt]
    blocks = w.data.reshape(w.out_features, -1, nbytes)
    d_w = blocks[..., :2].contiguous().view(torch.float16).squeeze(-1).double()
    if w.fmt == "q8_0":
        q_w = blocks[..., 2:].contiguous().view(torch.int8).long()
        m_w = torch.zeros_like(d_w)
    else:
        packed = blocks[..., 4:] if w.fmt == "q4_1" else blocks[..., 2:]
        q_w = torch.cat([packed & 0xF, packed >> 4], dim=-1).long()
        m_w = (
            blocks[..., 2:4].contiguous().view(torch.float16).squeeze(-1).double()
            if w.fmt == "q4_1"
            else -8 * d_w
        )
    xb = x.reshape(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1)
    d_x = (amax / 127).double()
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    q_x = torch.round(xb * inv.unsqueeze(-1)).long()  # float32 product, half to even
    dots = torch.einsum("rbk,obk->rob", q_x, q_w).double()  # exact integers
    return (dots * d_w * d_x[:, None]).sum(-1) + (m_w * (d_x * q_x.sum(-1))[:, None]).sum(-1)


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
def test_interleaved_products_are_their_definition(interleaving, fmt):
    """The C result is the float64 emulation up to float32 rounding of a few terms: a wrong
    rounding of one activation moves an output by ~|w| d_x, hundreds of times more."""
    w = _weight(fmt, 48, 19 * 32)
    if fmt == "q8_0":  # the quant -128 (stored as 0 after the + 128) must multiply right too
        data = w.data.clone()
        data[:, 2 + 34 * 3] = 0x80
        w = Q.QuantizedTensor(data, fmt, w.in_features)
    x = torch.randn(7, 19 * 32)
    want = _q8_emulated(x, w)
    got = Q.quant_matmul_c(interleaving, x, Q._interleave_c(interleaving, w), None, "q8")
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.equal(Q._interleave_c(interleaving, w).dequantize(), Q.dequantize_ref(w))


def test_eight_bit_prefill_parts_give_the_same_bits(interleaving):
    """More than Q8_MAX_ROWS rows run in parts; rows are quantized alone, so any split holds."""
    layer = Q.QuantizedLinear(_weight("q4_1", 64, 96), torch.randn(64), act="q8")
    x = torch.randn(2 * Q.Q8_MAX_ROWS + 45, 96)
    got = layer(x)
    assert torch.equal(got[:7], layer(x[:7])) and torch.equal(got[-300:], layer(x[-300:]))


def test_quantized_linear_interleaves_only_for_eight_bit_activations(interleaving):
    w = _weight("q4_1", 48, 96)
    assert Q.QuantizedLinear(w, act="q8").weight.interleaved
    assert Q.QuantizedLinear(w, act="f32", amx="off").weight.packed
    odd = Q.QuantizedLinear(_weight("q4_1", 37, 96), act="q8")  # not a multiple of 16 rows
    assert odd.weight.packed and odd.c_mode == "q8"
    x = torch.randn(5, 96)
    layer = Q.QuantizedLinear(w, act="q8")
    assert torch.equal(layer(x), Q.quant_matmul_c(interleaving, x, layer.weight, None, "q8"))
    with pytest.raises(ValueError, match="interleaved"):
        Q.quant_matmul(x, layer.weight, act="f32")
    with pytest.raises(ValueError, match="interleaved"):
        Q.QuantizedTensor(w.data[:40], "q4_1", 96, interleaved=True)  # 40 rows
    with pytest.raises(ValueError, match="interleaved"):
        layer.weight.rows(torch.tensor([0, 1]))


@pytest.fixture(scope="module")
def tiling(lib):
    if not lib.quant_tile_supported():
        pytest.skip("no AMX tiles here (the tiled layout: Intel Sapphire Rapids on, Linux 5.16+)")
    return lib


# 50 blocks: more than one chunk of B operands (TILED_CHUNK 24), and an even and odd count
_TILED_WIDTHS = (32, 96, 19 * 32, 50 * 32)


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 15, 16, 17, 33, 64])
def test_tiled_float_activations_are_the_float_products(tiling, fmt, rows):
    """Each activation is split into three bf16 parts that add up to it exactly, and the tile
    unit multiplies them by the exact bf16 quants without rounding: the result is the float
    product up to summation order. Its error against float64 is a float32 sum's (the packed
    float path's, within a small factor), where dropping the last part would cost ~2^-17 of
    every term."""
    for inputs in _TILED_WIDTHS:
        w = _weight(fmt, 48, inputs)
        x = torch.randn(rows, inputs)
        bias = torch.randn(48)
        exact = x.double() @ Q.dequantize_ref(w).double().T + bias.double()
        got = Q.quant_matmul_c(tiling, x, Q._tile_c(tiling, w), bias, "f32")
        packed = Q.quant_matmul_c(tiling, x, w.to_packed(), bias, "f32")
        scale = (x.double().abs() @ Q.dequantize_ref(w).double().abs().T).max().item()
        err, packed_err = (got - exact).abs().max().item(), (packed - exact).abs().max().item()
        assert err <= max(4 * packed_err, 4e-7 * scale), (inputs, err, packed_err)
        assert err <= 2**-24 * inputs * scale


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
def test_a_tiled_row_does_not_depend_on_its_batch(tiling, fmt):
    """One row tile of up to 16 rows is configured at its size, more are padded with zero rows:
    a row's bits are the same alone, among any number of rows and at any place among them,
    over several chunks of blocks."""
    _assert_batch_free(tiling, Q._tile_c(tiling, _weight(fmt, 64, 50 * 32)), "f32", 41)


def test_quantized_linear_tiles_float_activations_where_amx_runs(tiling):
    w = _weight("q4_1", 48, 96)
    assert Q.QuantizedLinear(w, act="f32").weight.tiled
    assert Q.QuantizedLinear(w, act="f32", amx="on").weight.tiled
    assert Q.QuantizedLinear(w, act="f32", amx="off").weight.packed
    assert not Q.QuantizedLinear(w, act="q8").weight.tiled
    assert Q.QuantizedLinear(_weight("q4_1", 37, 96), act="f32").weight.packed  # 37 rows
    layer = Q.QuantizedLinear(w, torch.randn(48), act="f32")
    x = torch.randn(2 * Q.DIRECT_MAX_ROWS + 7, 96)  # prefill parts
    got = layer(x)
    assert torch.equal(got[:7], layer(x[:7])) and torch.equal(got[-100:], layer(x[-100:]))
    with pytest.raises(ValueError, match="tiled"):
        Q.quant_matmul(x, layer.weight, act="q8")
    with pytest.raises(ValueError, match="tiled"):
        layer.weight.rows(torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="tiled"):
        Q.QuantizedTensor(w.data[:40], "q4_1", 96, tiled=True)  # 40 rows
    with pytest.raises(ValueError, match="amx"):
        Q.QuantizedLinear(w, amx="yes")
    with pytest.raises(ValueError, match="one layout at most, got packed and tiled"):
        Q.QuantizedTensor(
            Q._tile_c(tiling, _weight("q8_0", 16, 256)).data, "q8_0", 256, True, False, True
        )


def test_amx_on_is_refused_where_the_tiles_do_not_run(lib, monkeypatch):
    """``amx="on"`` is a requirement: with the tiled path unavailable (no AMX, or a probe that
    failed) it is an error, not the packed path in its place; ``auto`` packs."""
    monkeypatch.setattr(Q, "_tiles_ok", lambda lib: False)
    w = _weight("q4_1", 48, 96)
    assert Q.QuantizedLinear(w, act="f32").weight.packed
    with pytest.raises(ValueError, match="amx: on needs AMX tiles"):
        Q.QuantizedLinear(w, act="f32", amx="on")
    assert not Q.amx_available()


def _check_rows_alike(lib, fmt: str, outputs: int, widths: tuple[int, ...]) -> None:
    """A float-activation row's bits are the same alone and among any number of rows: decode
    and speculative verify rows (1-9, the few-row kernels), the small GEMM's (10 on) and the
    prefill parts'; packed where the format has the C layout, else in GGUF blocks. And the rows
    stay within the reference's tolerance."""
    for inputs in widths:
        gguf = _weight(fmt, outputs, inputs)
        w = gguf.to_packed() if fmt in Q.ACT_Q8_FORMATS else gguf
        bias = torch.randn(outputs)
        x = torch.randn(300, inputs)
        alone = torch.cat([Q.quant_matmul_c(lib, x[i : i + 1], w, bias, "f32") for i in range(40)])
        for n in (*range(2, 14), 17, 40):
            got = Q.quant_matmul_c(lib, x[:n], w, bias, "f32")
            assert torch.equal(got, alone[:n]), (fmt, inputs, n)
        layer = Q.QuantizedLinear(gguf, bias)  # 300 rows: three prefill parts
        assert torch.equal(layer(x)[:40], alone), (fmt, inputs)
        want = Q.quant_matmul_ref(x[:40], gguf, bias)
        assert (alone - want).abs().max() <= 1e-4 * want.abs().max(), (fmt, inputs)


@pytest.mark.parametrize("fmt", list(Q.FORMATS))
def test_a_float_row_does_not_depend_on_its_batch(lib, fmt):
    widths = (32, 19 * 32, 1536) if fmt in Q.ACT_Q8_FORMATS else (256, 1536)
    _check_rows_alike(lib, fmt, 101, widths)


def test_the_avx2_build_sums_a_float_row_alike_in_any_batch(avx2_build):
    """Built without AVX-512 (a CPU with AVX2 only), so a prompt's logits do not depend on how
    much of it was cached there either: the few-row tile (packed formats) and the per-row loop
    (K-quants) sum a row as the small GEMM does, bit for bit. 37 and 38 outputs: partial tiles
    of 1 and 2."""
    lib = Q.quant_c_library()
    assert lib is not None and lib.quant_simd_level() >= 1
    for fmt in Q.FORMATS:
        for outputs in (37, 38):
            widths = (32, 19 * 32, 576) if fmt in Q.ACT_Q8_FORMATS else (256, 768)
            _check_rows_alike(lib, fmt, outputs, widths)
    avx2_build()


@pytest.mark.parametrize("fmt", ["q4_1", "q6_k"])
def test_linear_layer_with_bias_and_strided_rows(lib, fmt):
    inputs = _widths(fmt)[-1]
    w = _weight(fmt, 45, inputs)
    bias = torch.randn(45)
    layer = Q.QuantizedLinear(w, bias)
    x = torch.randn(80, inputs)[::2]  # 40 rows, row stride 2 * inputs
    want = Q.quant_matmul_ref(x, w, bias)
    tolerance = 0.02 if layer.weight.packed else 1e-4
    assert (layer(x) - want).abs().max() <= tolerance * want.abs().max()
    assert layer(x[:0]).shape == (0, 45)


@pytest.mark.parametrize("fmt", ["q4_1", "q8_0", "q4_k"])
def test_prefill_rows_run_in_parts_with_the_small_gemms_results(lib, fmt):
    """More than DIRECT_MAX_ROWS float-activation rows run the C small GEMM in near-equal parts
    (not torch's GEMM on a dequantized copy): each row's bits are those of any 10-128-row call
    holding it, and the whole matches the reference."""
    inputs = _widths(fmt)[-1]
    w = _weight(fmt, 70, inputs)
    bias = torch.randn(70)
    layer = Q.QuantizedLinear(w, bias)
    rows = 2 * Q.DIRECT_MAX_ROWS + 45  # three parts of 100 and 101 rows
    x = torch.randn(rows, inputs)
    got = layer(x)
    for lo, hi in ((0, 100), (150, 201), (290, 301)):  # 10-128-row calls over other slices
        assert torch.equal(layer(x[lo:hi]), got[lo:hi])
    want = Q.quant_matmul_ref(x, w, bias)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()


def test_quantize_rounds_to_nearest_per_block():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(16, 64, generator=g)
    for fmt, bound in (("q8_0", 1 / 127), ("q4_0", 1 / 7), ("q4_1", 1 / 15)):
        back = Q.dequantize_ref(Q.quantize(weight, fmt))
        scale = weight.reshape(16, 2, 32).abs().amax(-1, keepdim=True)  # per block
        err = (back - weight).reshape(16, 2, 32).abs()
        assert (err <= scale * bound + 1e-6).all(), fmt
    with pytest.raises(ValueError, match="quantization"):
        Q.quantize(weight, "q6_k")
    with pytest.raises(ValueError, match="multiple"):
        Q.quantize(torch.randn(4, 40), "q8_0")


def test_weights_check_their_shape():
    with pytest.raises(ValueError, match="expected uint8"):
        Q.QuantizedTensor(torch.zeros(3, 10, dtype=torch.uint8), "q8_0", 32)
    with pytest.raises(ValueError, match="multiple"):
        Q.QuantizedTensor(torch.zeros(3, 34, dtype=torch.uint8), "q8_0", 40)
    with pytest.raises(ValueError, match="packed"):
        Q.QuantizedTensor(torch.zeros(3, 144, dtype=torch.uint8), "q4_k", 256, packed=True)


def test_rows_concatenate_within_one_format(lib):
    a, b = _weight("q4_1", 5, 64), _weight("q4_1", 7, 64, seed=1)
    both = Q.cat_rows([a, b])
    assert torch.equal(
        Q.dequantize_ref(both), torch.cat([Q.dequantize_ref(a), Q.dequantize_ref(b)])
    )
    with pytest.raises(ValueError, match="one format"):
        Q.cat_rows([a, _weight("q8_0", 5, 64)])


@pytest.mark.parametrize("packed", [False, True])
def test_embedding_expands_only_the_rows_looked_up(lib, packed):
    w = _weight("q8_0", 50, 96)
    table = w.to_packed() if packed else w
    ids = torch.tensor([3, 0, 49, 3])
    assert torch.equal(Q.embedding(ids, table), Q.dequantize_ref(w)[ids])
    with pytest.raises(IndexError, match="out of range"):
        Q.embedding(torch.tensor([50]), table)


def test_reference_path_without_the_c_kernels(monkeypatch):
    """RADIXGEN_KERNEL_BACKEND=torch: the dispatching function runs the reference."""
    monkeypatch.setenv("RADIXGEN_KERNEL_BACKEND", "torch")
    w = _weight("q4_0", 9, 64)
    x = torch.randn(3, 64)
    assert torch.equal(Q.quant_matmul(x, w), Q.quant_matmul_ref(x, w))


def test_concurrent_callers_each_get_their_own_result(lib):
    """The spinning pool runs one caller's job at a time; a second caller meanwhile computes on
    its own thread (and gets the same bits)."""
    w = _weight("q4_1", 300, 576).to_packed()
    xs = [torch.randn(4, 576, generator=torch.Generator().manual_seed(i)) for i in range(4)]
    want = [Q.quant_matmul_c(lib, x, w, None, "q8") for x in xs]
    got: dict[int, list[torch.Tensor]] = {i: [] for i in range(4)}

    def work(i: int) -> None:
        for _ in range(50):
            got[i].append(Q.quant_matmul_c(lib, xs[i], w, None, "q8"))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(4):
        assert all(torch.equal(y, want[i]) for y in got[i])


def test_woken_workers_change_no_result(lib):
    """``wake_threads`` (called as a request arrives) wakes the pool's sleeping workers with no
    job; they spin, find none, sleep again, and the next jobs give the same bits. Workers that
    move off their caller's CPU (``leave_caller_cpu``) compute the same parts."""
    import time

    from radixgen.kernels import wake_threads

    w = _weight("q4_1", 300, 576).to_packed()
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(7))
    want = Q.quant_matmul_c(lib, x, w, None, "q8")
    for pause in (0.0, 0.005, 0.0):  # 5 ms: the workers went to sleep (they spin 2 ms)
        time.sleep(pause)
        wake_threads()
        wake_threads()
        assert torch.equal(Q.quant_matmul_c(lib, x, w, None, "q8"), want)


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_triton_kernel_matches_the_reference(triton_backend, device, fmt, rows):
    w = _weight(fmt, 37, 96)
    x = torch.randn(rows, 96)
    bias = torch.randn(37)
    want = Q.quant_matmul_ref(x, w, bias)
    on_device = w.to(device)
    got = Q.quant_matmul(x.to(device), on_device, bias.to(device), backend=triton_backend)
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
def test_blocks_expand_on_the_device_as_the_reference_does(device, fmt):
    """``dequantize_torch``: a GPU's embedding lookups and prefill expand Q4_0/Q4_1/Q8_0 blocks
    with torch ops on the device, to the reference's values bit for bit."""
    w = _weight(fmt, 37, 19 * 32)
    on_device = w.to(device)
    assert torch.equal(Q.dequantize_torch(on_device).cpu(), Q.dequantize_ref(w))
    half = Q.dequantize_torch(on_device, torch.float16)
    assert half.dtype == torch.float16 and torch.equal(half.cpu(), Q.dequantize_ref(w).half())
    with pytest.raises(ValueError, match="GGUF blocks"):
        Q.dequantize_torch(w.to_packed())


@pytest.mark.parametrize("fmt", Q.ACT_Q8_FORMATS)
def test_the_layer_on_triton_decodes_on_blocks_and_expands_them_for_prefill(
    triton_backend, device, monkeypatch, fmt
):
    """Where Triton runs (a GPU; here forced, interpreted): up to ``TRITON_MAX_ROWS`` rows on
    the kernel, more through the device's GEMM over the expanded blocks, the output in the
    activations' dtype; the blocks stay in GGUF's layout, and the embedding expands its rows
    on the device."""
    monkeypatch.setenv("RADIXGEN_KERNEL_BACKEND", "triton")
    w = _weight(fmt, 37, 96)
    on_device = w.to(device)
    bias = torch.randn(37)
    layer = Q.QuantizedLinear(on_device, bias.to(device))
    assert layer.triton and layer.lib is None and not layer.weight.layout
    for rows in (3, Q.TRITON_MAX_ROWS + 16):
        x = torch.randn(rows, 96)
        want = Q.quant_matmul_ref(x, w, bias)
        got = layer(x.to(device))
        assert got.dtype == torch.float32 and got.shape == (rows, 37)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    ids = torch.tensor([0, 36, 5, 5])
    looked_up = Q.embedding(ids.to(device), on_device)
    assert torch.equal(looked_up.cpu(), Q.dequantize_ref(w)[ids])
    assert Q.embedding(ids[:0].to(device), on_device).shape == (0, 96)
    half = torch.randn(2, 96, dtype=torch.float16).to(device)
    head = Q.QuantizedLinear(on_device, out_dtype=torch.float32)  # a head: float32 logits
    assert layer(half).dtype == torch.float16 and head(half).dtype == torch.float32
