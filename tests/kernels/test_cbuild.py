"""Building, caching and loading the C kernels (kernels/_cbuild.py): a failed build falls back
to the torch paths with a warning, a build is cached per machine, every C file ships with the
package."""

from __future__ import annotations

import logging
import math
import shutil
from pathlib import Path

import pytest
import torch
from radixgen.kernels import _cbuild
from radixgen.kernels.attention import decode_attention, decode_attention_ref
from radixgen.kernels.attention.decode_native import (
    native_decode_attention,
    native_decode_available,
)

pytestmark = pytest.mark.usefixtures("native_env")


def make_inputs():
    """A 3-request float32 decode batch over scattered slots (GQA 4/2)."""
    k_buffer, v_buffer = torch.randn(400, 2, 64), torch.randn(400, 2, 64)
    req_to_token = torch.randperm(399)[:300].add(1).view(3, 100).int()
    rows, seq_lens = torch.tensor([2, 0, 1]), torch.tensor([50, 100, 1])
    q = torch.randn(3, 4, 64)
    return q, k_buffer, v_buffer, req_to_token, rows, seq_lens, 1 / math.sqrt(64)


@pytest.mark.parametrize("failure", ["compiler fails", "cache folder unwritable"])
def test_a_failed_build_falls_back_with_a_warning(
    failure, monkeypatch, tmp_path, caplog, assert_close
):
    monkeypatch.setattr(_cbuild, "_state", {})
    if failure == "compiler fails":
        monkeypatch.setenv("RADIXGEN_CACHE", str(tmp_path))
        monkeypatch.setenv("CC", shutil.which("false") or "/bin/false")
    else:
        (tmp_path / "a-file").write_text("")
        monkeypatch.setenv(
            "RADIXGEN_CACHE", str(tmp_path / "a-file")
        )  # no folder can be made under it
    args = make_inputs()
    with caplog.at_level(logging.WARNING, logger="radixgen.kernels._cbuild"):
        assert native_decode_attention(*args) is None
    assert "could not build" in caplog.text
    assert_close(decode_attention(*args), decode_attention_ref(*args))


def test_the_build_is_cached_per_machine(monkeypatch, tmp_path):
    monkeypatch.setattr(_cbuild, "_state", {})
    monkeypatch.setenv("RADIXGEN_CACHE", str(tmp_path))
    assert native_decode_available()
    built = list((tmp_path / "native").glob("cpu_kernels-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(_cbuild, "_state", {})
    assert native_decode_available()
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt


def test_every_c_file_ships_with_the_package():
    """An installed (non-editable) package must carry the sources and headers it compiles."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    pyproject = Path(__file__).parents[2] / "pyproject.toml"
    patterns = tomllib.loads(pyproject.read_text())["tool"]["setuptools"]["package-data"][
        "radixgen.kernels"
    ]
    kernels_dir = Path(_cbuild.__file__).parent
    shipped = {path.name for pattern in patterns for path in kernels_dir.glob(pattern)}
    on_disk = {
        path.name for path in (kernels_dir / "csrc").iterdir() if path.suffix in (".c", ".h")
    }
    assert on_disk == set(_cbuild.SOURCES) | set(_cbuild.HEADERS)
    assert on_disk <= shipped
