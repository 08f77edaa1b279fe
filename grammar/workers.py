"""Compile grammars in worker processes, so that no compile can slow another request.

A compile is pure Python: in a thread it holds the GIL, and the engine thread, which needs
the GIL between every two torch calls, waits (6 hostile schemas compiling made a plain
request's TTFT 100x and its TPOT 12x). ``CompileWorkers`` runs each compile in one of a few
worker processes (``python -m radixgen.grammar.compile_worker``: a fresh interpreter that
inherits none of the parent's threads and never imports the caller's main module) and gets
the compiled grammar back pickled; the parent only unpickles it and attaches its own
vocabulary. A worker that runs past the budget (plus a second) is killed and replaced, so
the request fails within budget + 1 s whatever the front end does; a worker whose memory
peaked past ``max_rss_mb`` is replaced after its task, so memory returns to where it was.

The pipe carries length-prefixed pickles: the vocabulary and settings once, then
``(kind, key, spec, options)`` requests and ``(status, value, peak RSS MB)`` replies. A spec
made of JSON values travels as its JSON text (``JsonSpec``): pickling a schema nested a few
hundred levels deep would pass this process's recursion limit, and the worker's is higher.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
from typing import IO, Any

from .errors import GrammarError
from .tokens.vocabulary import Vocabulary

logger = logging.getLogger(__name__)
WORKER_MODULE = "radixgen.grammar.compile_worker"
_HEADER = struct.Struct("<Q")


class JsonSpec(str):
    """A spec of JSON values written as JSON text, for the pipe (``load`` reads it back)."""

    def load(self) -> Any:
        return json.loads(self)


def to_wire(kind: str, spec: Any) -> Any:
    """``spec`` as the pipe carries it: containers as ``JsonSpec`` text."""
    if not isinstance(spec, dict | list):
        return spec
    try:
        return JsonSpec(json.dumps(spec, ensure_ascii=False, allow_nan=False))
    except RecursionError:
        raise GrammarError(f"{kind}: nested too deeply to compile", source=kind) from None
    except (TypeError, ValueError):  # not JSON (NaN, a set...): the worker gets it pickled
        return spec


def run_when_idle() -> None:
    """Run the calling thread only on CPU time nothing else wants (Linux ``SCHED_IDLE``; nice
    10 elsewhere). At nice 10 six hostile compiles still made a plain request's decode steps
    1.2-1.6x slower on 2 cores: a nice-10 thread keeps ~10 % of a core and the engine's
    kernel threads wait for each other at every call. Compiles do not starve meanwhile: a
    decode step leaves a core idle for its Python parts (a 140 ms compile took 180-340 ms
    beside 16 streams decoding)."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(10)


def send(stream: IO[bytes], value: Any) -> None:
    send_bytes(stream, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def send_bytes(stream: IO[bytes], data: bytes) -> None:
    """One frame of raw bytes (a grammar pickled already: not copied into another pickle)."""
    stream.write(_HEADER.pack(len(data)))
    stream.write(data)
    stream.flush()


def receive(stream: IO[bytes]) -> Any:
    return pickle.loads(receive_bytes(stream))


def receive_bytes(stream: IO[bytes]) -> bytes:
    header = _read_exactly(stream, _HEADER.size)
    return _read_exactly(stream, _HEADER.unpack(header)[0])


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    parts, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError("the pipe closed")
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


class CompileWorkers:
    """A few compile processes over one vocabulary; ``run`` is thread-safe and blocking."""

    def __init__(
        self,
        vocab: Vocabulary,
        settings: dict[str, Any],
        *,
        count: int = 2,
        timeout_s: float = 10.0,
        max_rss_mb: int = 2048,
        defer_heavy: bool = False,
    ) -> None:
        self.vocab = vocab
        self.defer_heavy = defer_heavy
        self.settings = settings
        self.timeout_s = timeout_s
        self.max_rss_mb = max_rss_mb
        self._idle: list[_Worker] = []
        self._available = threading.Semaphore(count)
        self._lock = threading.Lock()
        self.last_peak_mb = 0  # the peak RSS the last worker to answer reported (MB)
        processes = [self._launch() for _ in range(count)]  # their imports run side by side
        self._idle = [self._greet(process) for process in processes]

    def _launch(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )

    def _greet(self, process: subprocess.Popen[bytes]) -> _Worker:
        assert process.stdin is not None
        send(process.stdin, (self.vocab, self.settings))
        return _Worker(process)

    def _start(self) -> _Worker:
        return self._greet(self._launch())

    def run(self, kind: str, key: tuple[str, str, str], spec: Any, options: dict[str, Any]) -> Any:
        """The compiled grammar (raises the worker's ``GrammarError``, or one for a worker
        that ran out of time or died)."""
        with self._available:
            with self._lock:
                worker = self._idle.pop()
            try:
                status, value, rss_mb = worker.call(
                    (kind, key, to_wire(kind, spec), options), self.timeout_s + 1.0
                )
            except _WorkerLost as lost:
                worker.kill()
                worker = self._start()
                raise GrammarError(f"{kind}: {lost}", source=kind) from None
            finally:
                with self._lock:
                    self._idle.append(worker)
            self.last_peak_mb = rss_mb
            if rss_mb > self.max_rss_mb:
                logger.info("grammar worker peaked at %d MB: replacing it", rss_mb)
                replacement = self._start()
                with self._lock:
                    self._idle.remove(worker)
                    self._idle.append(replacement)
                worker.kill()
        if status == "error":
            raise value
        data, heavy = value
        if heavy and self.defer_heavy:
            return PickledGrammar(data, kind, key, self.vocab)
        try:
            grammar = pickle.loads(data)  # the worker pickled it on its own
        except Exception as exc:
            raise GrammarError(f"{kind}: the compiled grammar did not unpickle: {exc}") from None
        grammar.attach(self.vocab)
        return grammar

    def shutdown(self) -> None:
        with self._lock:
            for worker in self._idle:
                worker.kill()
            self._idle.clear()


class PickledGrammar:
    """A heavy grammar as its compile worker sent it, still pickled (``defer_heavy``).

    Its matchers run in the mask worker (``remote.py``), which gets ``payload`` as it is, so
    this process need not unpickle it: for a closed object of 2,000 properties that is ~30 ms
    holding the GIL, and pickling it again for the mask worker ~40 ms more, on the caller's
    thread while the engine thread waits for the GIL. Anything else asked of it (``matcher``,
    ``canonical_json``...) unpickles it once and answers as the grammar."""

    heavy = True

    def __init__(self, payload: bytes, kind: str, key: tuple[str, str, str], vocab: Vocabulary):
        self.payload = payload
        self.kind = kind
        self.key = key
        self._vocab = vocab
        self._grammar: Any = None
        self._lock = threading.Lock()

    def load(self) -> Any:
        """The grammar itself (unpickled on first use)."""
        with self._lock:
            if self._grammar is None:
                grammar = pickle.loads(self.payload)
                grammar.attach(self._vocab)
                self._grammar = grammar
            return self._grammar

    def nbytes(self) -> int:
        """Its bytes, and the grammar's once unpickled (never unpickles to answer)."""
        grammar = self._grammar
        return len(self.payload) + (int(grammar.nbytes()) if grammar is not None else 0)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_grammar", "_lock", "_vocab", "payload"):
            raise AttributeError(name)
        return getattr(self.load(), name)

    def __repr__(self) -> str:
        return f"PickledGrammar(kind={self.kind!r}, {len(self.payload)} bytes)"


class DeferredCall:
    """A callable that travels pickled and is unpickled on its first call.

    A compiled JSON Schema grammar carries its canonical writer (the schema's IR: for an
    enum of 100,000 strings, 100,000 objects). Decoding never calls it, but unpickling it in
    the engine process held the GIL ~10 ms, a stall of every decode step meanwhile. So
    grammars pickle it as one ``bytes`` (``wrap``), which unpickles as a copy, and only a
    caller of ``canonical_json`` (tests, conformance) pays for the objects. Pickled again
    (for the mask worker), it sends the same bytes."""

    __slots__ = ("_payload", "_call")

    def __init__(self, payload: bytes) -> None:
        self._payload = payload
        self._call: Any = None

    @classmethod
    def wrap(cls, call: Any) -> Any:
        """``call`` ready to pickle deferred (None stays None)."""
        if call is None or isinstance(call, cls):
            return call
        return cls(pickle.dumps(call, protocol=pickle.HIGHEST_PROTOCOL))

    def __call__(self, *args: Any) -> Any:
        if self._call is None:  # two first calls at once only unpickle twice
            self._call = pickle.loads(self._payload)
        return self._call(*args)

    def __reduce__(self) -> tuple[Any, ...]:
        return (DeferredCall, (self._payload,))


class _WorkerLost(Exception):
    pass


class _Worker:
    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process

    def call(self, request: tuple[Any, ...], timeout_s: float) -> tuple[str, Any, int]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            send(stdin, request)
            ready, _, _ = select.select([stdout], [], [], timeout_s)
            if not ready:
                raise _WorkerLost(f"compilation timed out after {timeout_s - 1.0:g} s")
            reply: tuple[str, Any, int] = receive(stdout)
            if reply[0] == "ok":  # the grammar follows, pickled (and whether it is heavy)
                reply = ("ok", (receive_bytes(stdout), reply[1]), reply[2])
        except (EOFError, OSError, pickle.UnpicklingError) as exc:
            raise _WorkerLost(f"the compile worker died ({type(exc).__name__})") from None
        return reply

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
