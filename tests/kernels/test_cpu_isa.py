"""The CPU kernels' run-time ISA levels (kernels/_cbuild.py): each level this CPU has builds,
loads and passes every op's probe against its torch reference, forced by RADIXGEN_CPU_ISA in a
fresh process (the library loads once per process); a level the CPU lacks is never loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from radixgen.kernels import _cbuild

PROBE = """
import json
from radixgen.kernels import _cbuild, activation, decode_layers, norm, quant, rotary
from radixgen.kernels.attention import block_native, decode_native
libs = {
    "quant_matmul": quant.quant_c_library(),
    "rms_norm": norm.rms_norm_c_library(),
    "silu_mul": activation.silu_mul_c_library(),
    "rotary": rotary.rotary_c_library(),
    "decode_attention": decode_native.decode_c_library(),
    "block_attention": block_native.block_c_library(),
    "decode_layers": decode_layers.decode_layers_library(),
}
q = libs["quant_matmul"]
print(json.dumps({
    "isa": _cbuild.loaded_isa(),
    "bound": {name: lib is not None for name, lib in libs.items()},
    "simd": q.quant_simd_level() if q is not None else None,
}))
"""

# quant_simd_level(): 0 plain C, 1 AVX2, 2 AVX-512 VNNI
EXPECTED_SIMD = {"generic": 0, "avx2": 1, "avx512": 2}


def run_probe(level: str) -> dict:
    env = {**os.environ, _cbuild.ISA_ENV: level, "RADIXGEN_NATIVE_KERNELS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_supported_levels_follow_the_cpu_flags(monkeypatch):
    monkeypatch.setattr(_cbuild.platform, "machine", lambda: "x86_64")
    avx2 = frozenset({"avx2", "fma", "f16c", "bmi2", "sse2"})
    assert _cbuild.supported_isas(avx2) == ["native", "avx2", "generic"]
    avx512 = avx2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}
    assert _cbuild.supported_isas(avx512) == ["native", "avx512", "avx2", "generic"]
    assert _cbuild.supported_isas(frozenset({"sse2"})) == ["native", "generic"]
    monkeypatch.setattr(_cbuild.platform, "machine", lambda: "aarch64")
    assert _cbuild.supported_isas(avx512) == ["native", "generic"]


def test_a_level_this_cpu_lacks_or_an_unknown_name_is_not_used(monkeypatch, caplog):
    monkeypatch.setattr(_cbuild, "supported_isas", lambda flags=None: ["native", "generic"])
    monkeypatch.setenv(_cbuild.ISA_ENV, "avx512")
    assert _cbuild.isa()[0] == "native"
    assert "avx512" in caplog.text and _cbuild.ISA_ENV in caplog.text
    monkeypatch.setenv(_cbuild.ISA_ENV, "sse9")
    assert _cbuild.isa()[0] == "native"
    monkeypatch.setenv(_cbuild.ISA_ENV, "generic")
    assert _cbuild.isa() == ("generic", f"forced by {_cbuild.ISA_ENV}")
    monkeypatch.delenv(_cbuild.ISA_ENV)
    assert _cbuild.isa()[0] == "native"


def test_every_flag_set_of_a_level_carries_its_march():
    for level, (march, _) in _cbuild.ISA_LEVELS.items():
        sets = _cbuild.flag_sets(level)
        assert sets[0][: len(sets[0]) - len(march)] == ["-O3", "-fno-math-errno", "-fopenmp"]
        assert sets[0][len(sets[0]) - len(march) :] == march
        assert len(sets) == len({tuple(s) for s in sets})


@pytest.mark.parametrize("level", [lv for lv in _cbuild.ISA_LEVELS if lv != "native"])
def test_each_level_this_cpu_has_passes_every_probe(level):
    """Forced to ``level``, every op's kernel matches its torch reference (the probes); the
    quantized matmuls report the path the level compiles; block attention has no scalar path."""
    if level not in _cbuild.supported_isas():
        pytest.skip(f"this CPU has no {level}")
    if not _cbuild.enabled():
        pytest.skip("native kernels disabled")
    got = run_probe(level)
    assert got["isa"] == level
    assert got["simd"] == EXPECTED_SIMD[level]
    want = {name: True for name in got["bound"]}
    if level == "generic":
        want["block_attention"] = False  # AVX2 + FMA or AVX-512 only; torch's SDPA instead
    assert got["bound"] == want
