"""Time every Triton kernel against its torch reference and the memory-bandwidth bound.

    python benchmarks/bench_kernels.py [--peak-gbps 4800]

On CUDA it prints one row per (kernel, shape): reference and Triton time (median of
``triton.testing.do_bench``), speedup, the bytes the kernel must move divided by its time, and
that as a fraction of the device's peak bandwidth (H200: ~4.8 TB/s). Without CUDA it prints
why it skipped and exits 0 (correctness on CPU is ``pytest tests/kernels``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from radixgen.kernels import attention, bitmask, kv_store, norm, quant, rotary


@dataclass(frozen=True)
class Case:
    kernel: str
    shape: str
    bytes_moved: int  # minimal traffic: every input read once, every output written once
    reference: Callable[[], object]
    triton: Callable[[], object]
    flops: int = 0  # matmul FLOPs, for the compute-bound attention cases


def bitmask_cases(device: torch.device) -> list[Case]:
    cases = []
    for batch, vocab_size in [(1, 151936), (64, 151936), (256, 49152)]:
        logits = torch.randn(batch, vocab_size, device=device)  # [B, V]
        words = torch.randint(-(2**31), 2**31, (batch, (vocab_size + 31) // 32), device=device)
        mask = words.to(torch.int32)  # [B, W], about half the tokens allowed
        disallowed = int((~bitmask.bitmask_to_bool(mask, vocab_size)).sum())
        cases.append(Case(
            "token_bitmask", f"B={batch} V={vocab_size} fp32", mask.numel() * 4 + disallowed * 4,
            lambda lg=logits, m=mask: bitmask.apply_token_bitmask_inplace_ref(lg, m),
            lambda lg=logits, m=mask: bitmask.apply_token_bitmask_inplace_triton(lg, m),
        ))  # fmt: skip
    return cases


def store_kv_cases(device: torch.device) -> list[Case]:
    cases = []
    for num_tokens, num_kv_heads, head_dim in [(64, 8, 128), (8192, 8, 128), (8192, 3, 64)]:
        shape = (num_tokens * 4 + 1, num_kv_heads, head_dim)
        k_buffer = torch.empty(shape, device=device, dtype=torch.bfloat16)  # [S, Hkv, D]
        v_buffer = torch.empty_like(k_buffer)
        slots = torch.randperm(shape[0] - 1, device=device)[:num_tokens] + 1  # [N]
        k = torch.randn(num_tokens, num_kv_heads, head_dim, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        args = (k_buffer, v_buffer, slots, k, v)
        cases.append(Case(
            "store_kv", f"N={num_tokens} Hkv={num_kv_heads} D={head_dim} bf16",
            4 * k.numel() * 2 + slots.numel() * 8,
            lambda a=args: kv_store.store_kv_ref(*a), lambda a=args: kv_store.store_kv_triton(*a),
        ))  # fmt: skip
    return cases


def make_pool(lens: list[int], num_kv_heads: int, head_dim: int, device: torch.device):
    num_slots = sum(lens) + 1
    k_buffer = torch.randn(num_slots, num_kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    v_buffer = torch.randn_like(k_buffer)  # [S, Hkv, D]
    req_to_token = torch.zeros(len(lens), max(lens), dtype=torch.int32, device=device)
    slots = torch.randperm(num_slots - 1, device=device).int() + 1  # scattered, as after reuse
    start = 0
    for row, length in enumerate(lens):
        req_to_token[row, :length] = slots[start : start + length]
        start += length
    rows = torch.arange(len(lens), device=device)
    return k_buffer, v_buffer, req_to_token, rows


def decode_cases(device: torch.device) -> list[Case]:
    cases = []
    for batch, seq_len, num_q_heads, num_kv_heads, head_dim in [
        (1, 4096, 32, 8, 128),
        (64, 1024, 32, 8, 128),
        (256, 512, 9, 3, 64),
    ]:
        lens = [seq_len] * batch
        k_buffer, v_buffer, req_to_token, rows = make_pool(lens, num_kv_heads, head_dim, device)
        q = torch.randn(batch, num_q_heads, head_dim, device=device, dtype=torch.bfloat16)
        seq_lens = torch.tensor(lens, device=device)
        args = (q, k_buffer, v_buffer, req_to_token, rows, seq_lens, head_dim**-0.5)
        kv_bytes = 2 * sum(lens) * num_kv_heads * head_dim * 2 + sum(lens) * 4
        cases.append(Case(
            "decode_attention",
            f"B={batch} L={seq_len} Hq={num_q_heads} Hkv={num_kv_heads} D={head_dim} bf16",
            kv_bytes + 2 * q.numel() * 2,
            lambda a=args: attention.decode_attention_ref(*a),
            lambda a=args: attention.decode_attention_triton(*a),
        ))  # fmt: skip
    return cases


def extend_cases(device: torch.device) -> list[Case]:
    cases = []
    for batch, prefix_len, extend_len, num_q_heads, num_kv_heads, head_dim in [
        (4, 0, 2048, 32, 8, 128),
        (16, 1024, 128, 32, 8, 128),
        (8, 512, 512, 9, 3, 64),
    ]:
        lens = [prefix_len + extend_len] * batch
        k_buffer, v_buffer, req_to_token, rows = make_pool(lens, num_kv_heads, head_dim, device)
        q = torch.randn(
            batch * extend_len, num_q_heads, head_dim, device=device, dtype=torch.bfloat16
        )
        prefix_lens = torch.full((batch,), prefix_len, device=device)
        extend_lens = torch.full((batch,), extend_len, device=device)
        args = (q, k_buffer, v_buffer, req_to_token, rows, prefix_lens, extend_lens, head_dim**-0.5)
        kv_bytes = 2 * sum(lens) * num_kv_heads * head_dim * 2 + sum(lens) * 4
        cases.append(Case(
            "extend_attention",
            f"B={batch} P={prefix_len} E={extend_len} Hq={num_q_heads} Hkv={num_kv_heads} "
            f"D={head_dim} bf16",
            kv_bytes + 2 * q.numel() * 2,
            lambda a=args: attention.extend_attention_ref(*a),
            lambda a=args: attention.extend_attention_triton(*a),
            flops=4 * num_q_heads * head_dim * batch * sum(
                prefix_len + j + 1 for j in range(extend_len)
            ),
        ))  # fmt: skip
    return cases


def norm_cases(device: torch.device) -> list[Case]:
    cases = []
    for num_tokens, hidden in [(64, 4096), (8192, 4096), (8192, 576)]:
        x = torch.randn(num_tokens, hidden, device=device, dtype=torch.bfloat16)  # [N, H]
        residual = torch.randn_like(x)
        weight = torch.rand(hidden, device=device, dtype=torch.bfloat16)
        args = (x, weight, 1e-5, residual)
        cases.append(Case(
            "rms_norm+residual", f"N={num_tokens} H={hidden} bf16", 4 * x.numel() * 2,
            lambda a=args: norm.rms_norm_ref(*a), lambda a=args: norm.rms_norm_triton(*a),
        ))  # fmt: skip
    return cases


def rotary_cases(device: torch.device) -> list[Case]:
    cases = []
    for num_tokens, num_q_heads, num_kv_heads, head_dim in [(64, 32, 8, 128), (8192, 32, 8, 128)]:
        cache = rotary.build_cos_sin_cache(head_dim, 16384, 500000.0).to(device)
        positions = torch.randint(0, 16384, (num_tokens,), device=device)
        q = torch.randn(num_tokens, num_q_heads, head_dim, device=device, dtype=torch.bfloat16)
        k = torch.randn(num_tokens, num_kv_heads, head_dim, device=device, dtype=torch.bfloat16)
        args = (q, k, positions, cache)
        moved = 2 * (q.numel() + k.numel()) * 2 + num_tokens * (head_dim * 4 + 8)
        cases.append(Case(
            "rotary", f"N={num_tokens} Hq={num_q_heads} Hkv={num_kv_heads} D={head_dim} bf16",
            moved,
            lambda a=args: rotary.apply_rotary_ref(*a), lambda a=args: rotary.apply_rotary_triton(*a),
        ))  # fmt: skip
    return cases


def quant_matmul_cases(device: torch.device) -> list[Case]:
    """Quantized weights (the blocks read once) times float activations; the reference
    dequantizes with the gguf package on the CPU each call, so its time is not a GPU number."""
    cases = []
    for fmt in quant.ACT_Q8_FORMATS:
        for rows, out, inputs in [(1, 4096, 4096), (16, 4096, 4096), (1, 14336, 4096)]:
            w = quant.quantize(torch.randn(out, inputs), fmt)
            on_device = w.to(device)
            x = torch.randn(rows, inputs, device=device)
            cases.append(Case(
                "quant_matmul", f"{fmt} N={rows} O={out} K={inputs} fp32", w.nbytes + x.numel() * 4,
                lambda x=x, w=w: quant.quant_matmul_ref(x.cpu(), w),
                lambda x=x, w=on_device: quant.quant_matmul_triton(x, w),
                flops=2 * rows * out * inputs,
            ))  # fmt: skip
    return cases


def run(cases: list[Case], peak_gbps: float) -> None:
    from triton.testing import do_bench

    header = f"{'kernel':<18} {'shape':<46} {'ref ms':>9} {'triton ms':>9} {'speedup':>7} " \
             f"{'GB/s':>7} {'% peak':>6} {'TFLOP/s':>7}"  # fmt: skip
    print(header)
    print("-" * len(header))
    for case in cases:
        ref_ms = do_bench(case.reference, warmup=10, rep=50, return_mode="median")
        triton_ms = do_bench(case.triton, warmup=10, rep=50, return_mode="median")
        gbps = case.bytes_moved / (triton_ms * 1e-3) / 1e9
        tflops = f"{case.flops / (triton_ms * 1e-3) / 1e12:>7.1f}" if case.flops else f"{'-':>7}"
        print(
            f"{case.kernel:<18} {case.shape:<46} {ref_ms:>9.4f} {triton_ms:>9.4f} "
            f"{ref_ms / triton_ms:>6.1f}x {gbps:>7.0f} {100 * gbps / peak_gbps:>5.1f}% {tflops}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--peak-gbps", type=float, default=4800.0, help="HBM peak (H200: 4800)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels: skipped - no CUDA device (Triton kernels are timed on GPUs only; "
              "on CPU run `pytest tests/kernels` for correctness)")  # fmt: skip
        return 0
    device = torch.device("cuda")
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name(device)}, peak bandwidth {args.peak_gbps:.0f} GB/s")
    cases = []
    for build in (
        bitmask_cases,
        store_kv_cases,
        decode_cases,
        extend_cases,
        norm_cases,
        rotary_cases,
        quant_matmul_cases,
    ):
        cases += build(device)
    run(cases, args.peak_gbps)
    print("GB/s = minimal bytes (inputs read once, outputs written once) / Triton time. "
          "Extend attention is compute-bound at long extends; its GB/s is not the limit there.")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
