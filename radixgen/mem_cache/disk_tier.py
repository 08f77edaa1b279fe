"""DiskTier: KV blocks in files under ``--hicache-dir``, found again after a restart.

Layout of the folder::

    tier.json                  what wrote it: format, model digest, KV layout, storage dtype
    .lock                      held (flock) by the one process using the folder
    blocks/ab/ab12...ef.kv     one block: 64-byte header, then the payload (kv_blocks)

    header  magic "RGKVBLK1" | block name (16 bytes) | payload length (u64) | crc32 (u32) | pad

A folder written by another model, dtype or layout is refused at start-up (``tier.json``);
the files themselves are checked on every read (length, name, crc32) and a bad one is
deleted and read as a miss. Writes run on a writer thread, off the engine's step: ``put``
only queues (a full queue drops the block, counted); a write that fails (disk full, folder
gone or read-only) logs a warning and drops the block, so a broken disk costs recomputation,
never a request. The folder is kept under ``max_bytes`` by deleting the least recently used
blocks (file modification times carry the order across restarts). Reads are on the engine
thread, through a read-only memory map.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import os
import queue
import struct
import threading
import time
import zlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch

from .kv_blocks import payload_bytes

logger = logging.getLogger("radixgen.hicache")

FORMAT = 1
MAGIC = b"RGKVBLK1"
_HEADER = struct.Struct("<8s16sQI28x")  # 64 bytes
META = "tier.json"
_WARN_EVERY_S = 60.0


def model_digest(path: str | Path) -> str:
    """A short digest naming a model's weights: each weight or config file's name and size
    and its first and last MiB (the whole of a small file). Cheap on a multi-GB file."""
    path = Path(path)
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    h = hashlib.blake2b(digest_size=16)
    for file in files:
        if file.suffix not in (".gguf", ".safetensors", ".bin", ".json", ".pt", ".pth"):
            continue
        size = file.stat().st_size
        h.update(f"{file.name}:{size}".encode())
        with open(file, "rb") as f:
            h.update(f.read(1 << 20))
            if size > 2 << 20:
                f.seek(-(1 << 20), os.SEEK_END)
                h.update(f.read())
    return h.hexdigest()


class DiskTier:
    """Blocks on disk under ``root``; ``put`` from the engine thread queues a write, ``get``
    reads synchronously (None: a miss, or a file that failed its checks and was deleted).

    ``about`` describes what the blocks are (model digest, layout, storage dtype, block
    size): a folder recorded with another ``about`` raises ValueError naming hicache_dir.
    OSError when the folder cannot be made or locked for writing (the caller runs without).
    """

    def __init__(self, root: Path, about: dict[str, Any], max_bytes: int, block_bytes: int) -> None:
        self.root, self.max_bytes, self.block_bytes = root, max_bytes, block_bytes
        (root / "blocks").mkdir(parents=True, exist_ok=True)
        self._lock_file = _lock(root)
        _check_or_record(root, about)
        self._index: OrderedDict[bytes, int] = _scan(root / "blocks")  # name -> bytes, LRU first
        self.num_bytes = sum(self._index.values())
        self._pending: dict[bytes, torch.Tensor] = {}
        self._mutex = threading.Lock()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=1024)
        self.num_written = self.num_dropped = self.num_corrupt = self.num_write_errors = 0
        self._warned_at = -_WARN_EVERY_S
        with self._mutex:
            self._shrink()
        self._writer = threading.Thread(target=self._write_loop, name="hicache-writer", daemon=True)
        self._writer.start()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, name: bytes) -> bool:
        with self._mutex:
            return name in self._index or name in self._pending

    # ------------------------------------------------------------------ engine thread
    def put(self, name: bytes, payload: torch.Tensor) -> None:
        """Queue block ``name`` for writing (a no-op when it is on disk or queued already).
        ``payload`` must not change afterwards."""
        with self._mutex:
            if name in self._index or name in self._pending:
                return
            try:
                self._queue.put_nowait(name)
            except queue.Full:
                self.num_dropped += 1
                return
            self._pending[name] = payload

    def get(self, name: bytes) -> torch.Tensor | None:
        """Block ``name``'s payload (a fresh CPU uint8 tensor), or None."""
        with self._mutex:
            pending = self._pending.get(name)
            if pending is not None:
                return pending
            if name not in self._index:
                return None
            self._index.move_to_end(name)
        path = self._path(name)
        try:
            payload = self._read(path, name)
            if payload is not None:
                os.utime(path)  # the least recently used order survives a restart
        except FileNotFoundError:  # deleted under us (by hand, or a shrink racing this read)
            self._forget(name)
            return None
        except OSError:
            payload = None
        if payload is None:
            self._drop(name, path)
        return payload

    def close(self, timeout: float = 30.0) -> None:
        """Finish the queued writes (at most ``timeout`` s), stop the writer, release the folder."""
        try:
            self._queue.put(None, timeout=timeout)
        except queue.Full:
            pass
        self._writer.join(timeout)
        self._lock_file.close()

    # ------------------------------------------------------------------ files
    def _path(self, name: bytes) -> Path:
        hexname = name.hex()
        return self.root / "blocks" / hexname[:2] / f"{hexname}.kv"

    def _read(self, path: Path, name: bytes) -> torch.Tensor | None:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            if len(mm) != _HEADER.size + self.block_bytes:
                return None
            magic, stored_name, length, crc = _HEADER.unpack_from(mm, 0)
            if (magic, stored_name, length) != (MAGIC, name, self.block_bytes):
                return None
            with memoryview(mm) as view:
                body = view[_HEADER.size :]
                ok = zlib.crc32(body) == crc
                payload = bytearray(body) if ok else None
                body.release()
        return None if payload is None else torch.frombuffer(payload, dtype=torch.uint8)

    def _forget(self, name: bytes) -> bool:
        with self._mutex:
            size = self._index.pop(name, None)
            if size is not None:
                self.num_bytes -= size
        return size is not None

    def _drop(self, name: bytes, path: Path) -> None:
        """A block that failed its checks: forget it, delete the file."""
        if not self._forget(name):
            return
        self.num_corrupt += 1
        logger.warning("hicache: dropped %s (failed its length, name or crc32 check)", path)
        path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ writer thread
    def _write_loop(self) -> None:
        try:  # the lowest priority: the engine's threads go first on a busy CPU (Linux)
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        while (name := self._queue.get()) is not None:
            with self._mutex:
                payload = self._pending[name]
            written = self._write(name, payload)
            with self._mutex:
                del self._pending[name]
                if written:
                    self._index[name] = _HEADER.size + self.block_bytes
                    self.num_bytes += _HEADER.size + self.block_bytes
                    self.num_written += 1
                    self._shrink()

    def _write(self, name: bytes, payload: torch.Tensor) -> bool:
        path = self._path(name)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        body = payload_bytes(payload).numpy().data
        header = _HEADER.pack(MAGIC, name, len(body), zlib.crc32(body))
        try:
            path.parent.mkdir(exist_ok=True)
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(body)
            os.replace(tmp, path)
            return True
        except OSError as exc:
            self.num_write_errors += 1
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            now = time.monotonic()
            if now - self._warned_at >= _WARN_EVERY_S:
                self._warned_at = now
                logger.warning(
                    "hicache: cannot write to %s (%s); blocks that do not fit are recomputed "
                    "when needed (%d write errors so far)",
                    self.root,
                    exc,
                    self.num_write_errors,
                )
            return False

    def _shrink(self) -> None:
        """Delete the least recently used blocks until the folder fits ``max_bytes`` (mutex held)."""
        while self.num_bytes > self.max_bytes and self._index:
            name, size = self._index.popitem(last=False)
            self.num_bytes -= size
            self._path(name).unlink(missing_ok=True)


def _lock(root: Path) -> Any:
    f = open(root / ".lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise ValueError(
            f"hicache_dir: {root} is in use by another radixgen process "
            "(one process per folder: give each server its own)"
        ) from None
    return f


def _check_or_record(root: Path, about: dict[str, Any]) -> None:
    """Record ``about`` in a new folder; in a used one, ValueError unless it is the same."""
    meta = root / META
    record = {"format": FORMAT, **about}
    if meta.exists():
        try:
            found = json.loads(meta.read_text())
        except (OSError, ValueError):
            found = {"format": "unreadable"}
        if found != record:
            theirs = ", ".join(f"{k}={found.get(k)}" for k in record if found.get(k) != record[k])
            ours = ", ".join(f"{k}={record[k]}" for k in record if found.get(k) != record[k])
            raise ValueError(
                f"hicache_dir: {root} holds KV blocks of another model or format ({theirs}; "
                f"this server: {ours}); point --hicache-dir at another folder or empty this one"
            )
        return
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True))
    os.replace(tmp, meta)


def _scan(blocks: Path) -> OrderedDict[bytes, int]:
    """The blocks already on disk, least recently used first; leftover temp files deleted."""
    found: list[tuple[float, bytes, int]] = []
    for entry in blocks.glob("*/*"):
        if entry.name.endswith(".tmp"):
            entry.unlink(missing_ok=True)
            continue
        try:
            name = bytes.fromhex(entry.name.removesuffix(".kv"))
            stat = entry.stat()
        except (ValueError, OSError):
            continue
        found.append((stat.st_mtime, name, stat.st_size))
    found.sort()
    return OrderedDict((name, size) for _, name, size in found)
