"""Matchers whose grammar runs in a worker process: slow token masks never stall the engine.

A grammar's first visit of a state computes its token mask. For most grammars that costs
microseconds (the C walk), but a rules grammar whose Earley columns hold thousands of items
(a closed object of 2,000 optional properties: every remaining property name is live after
each comma) costs tens of milliseconds per new column, in Python. On the engine thread that
stalls every stream in the batch; on another thread it holds the GIL, which the engine
thread needs between every two torch calls (a busy Python thread made a plain request's
TPOT 38x). So such grammars (``heavy``, judged when they compile) run in ``MaskWorker``, a
process at nice 10 (``python -m radixgen.grammar.mask_worker``), and the engine holds a
``RemoteMatcher`` per request: ``accept_token`` sends the token and returns at once; the
reply brings the mask of the next state, the tokens jump-forward takes after it (the worker
tokenizes the forced text as the engine would) and whether the grammar is complete.

The engine samples a remote request only when its reply is in (``ready``); until then the
request sits out steps with its logits kept, and its batch-mates go on. The outputs are the
same as a local matcher's, token for token. The pipe carries length-prefixed pickles
(``workers.send``/``receive``); a writer thread sends, so the engine thread never blocks on
a busy worker, and a reader thread takes replies and wakes the engine. A dead worker fails
its requests with an error and is started again for the next one.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import queue
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .tokens.table import decode_row
from .tokens.vocabulary import Vocabulary
from .workers import receive, send

logger = logging.getLogger(__name__)
WORKER_MODULE = "radixgen.grammar.mask_worker"
MAX_GRAMMARS = 16  # grammars the worker keeps for new requests
# a worker past this much memory is replaced once it serves no request (a closed object of
# 2,000 properties grows it by ~60 MB as its requests visit new states)
MAX_RSS_MB = 1536


class RemoteMatcher:
    """One request's cursor in a grammar held by the mask worker (engine thread only).

    ``ready``: the reply to the last ``accept_token`` (or to the opening) is in; then
    ``fill_bitmask`` writes its mask, ``forced_ids`` are the tokens the worker already
    accepted after it (jump-forward: the engine appends them), ``can_finish`` says the grammar
    is complete, and ``error`` is a message that must end the request. No ``rollback``: such
    requests do not draft (speculative decoding)."""

    def __init__(self, worker: MaskWorker, sid: int) -> None:
        self._worker = worker
        self.sid = sid
        self._sent = 1  # replies asked for (the opening is the first)
        self._done = 0  # replies received
        self._mask: np.ndarray | None = None
        self.forced_ids: list[int] = []
        self._can_finish = False
        self.error: str | None = None
        self.closed = False

    @property
    def ready(self) -> bool:
        return self.error is not None or self._done == self._sent

    def _reply(self, seq: int, mask: Any, forced: list[int], done: bool, error: str | None) -> None:
        """A reply (reader thread): the state after the ``seq``-th message."""
        self._mask = None if mask is None else decode_row(mask)
        self.forced_ids, self._can_finish = forced, done
        if error is not None and self.error is None:
            self.error = error
        self._done = seq  # last: the engine thread reads the rest once it sees this

    def accept_token(self, token_id: int) -> bool:
        """Send ``token_id`` (drawn under this matcher's mask); the reply comes later."""
        self._sent += 1
        self.forced_ids = []
        self._worker.post(("accept", self.sid, self._sent, int(token_id)))
        return True

    def consume_forced(self) -> list[int]:
        forced, self.forced_ids = self.forced_ids, []
        return forced

    def can_finish(self) -> bool:
        return self.ready and self._can_finish

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        mask = self._mask
        if not self.ready or mask is None:
            raise RuntimeError("fill_bitmask: the grammar worker has not answered yet")
        words = mask.shape[0]
        if bitmask.device.type == "cpu":  # the reply's mask is read-only: no tensor over it
            view = bitmask[row].numpy()
            view[:words], view[words:] = mask, 0
            return
        bitmask[row, :words].copy_(torch.from_numpy(mask.copy()))
        bitmask[row, words:].zero_()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._worker.post(("close", self.sid))


class MaskWorker:
    """The mask worker process and the threads that talk to it (thread-safe).

    ``on_reply`` is called (on the reader thread) after each reply, to wake the engine."""

    def __init__(
        self,
        vocab: Vocabulary,
        tokenizer_json: str,
        *,
        jump_forward: bool = True,
        max_forced: int = 64,
        on_reply: Callable[[], None] | None = None,
    ) -> None:
        self.vocab = vocab
        self.tokenizer_json = tokenizer_json
        self.settings = {"jump_forward": jump_forward, "max_forced": max_forced}
        self.on_reply = on_reply
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._process: subprocess.Popen[bytes] | None = None
        self._outbox: queue.SimpleQueue[Any] | None = None
        self._sessions: dict[int, RemoteMatcher] = {}
        self.rss_mb = 0  # the worker's memory, as its last reply said
        # grammars the worker holds, oldest first (it drops one when told to)
        self._sent_grammars: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def open(self, grammar: Any) -> RemoteMatcher:
        """A matcher at ``grammar``'s start (a ``CfgGrammar``); the first reply is its mask."""
        process = self._process
        if process is not None and process.poll() is not None:  # died; the reader may not
            self._lost(process)  # have seen it yet: a new request goes to a new worker
        with self._lock:
            if self._process is None:
                self._start()
            matcher = RemoteMatcher(self, next(self._ids))
            self._sessions[matcher.sid] = matcher
            key = grammar.key
            payload = None
            if key in self._sent_grammars:
                self._sent_grammars.move_to_end(key)
            else:  # as the compile worker sent it, where it is still pickled
                payload = getattr(grammar, "payload", None) or pickle.dumps(
                    grammar, protocol=pickle.HIGHEST_PROTOCOL
                )
                self._sent_grammars[key] = None
            self.post(("open", matcher.sid, key, payload))
            if len(self._sent_grammars) > MAX_GRAMMARS:  # its sessions keep their own reference
                self.post(("forget", self._sent_grammars.popitem(last=False)[0]))
        return matcher

    def post(self, message: tuple[Any, ...]) -> None:
        outbox = self._outbox
        if outbox is not None:
            outbox.put(message)
        if message[0] == "close":
            self._sessions.pop(message[1], None)
            if not self._sessions and self.rss_mb > MAX_RSS_MB:
                self._retire()

    def _retire(self) -> None:
        """Let the (idle) worker exit; the next ``open`` starts a fresh one."""
        with self._lock:
            if self._sessions or self._outbox is None:
                return
            logger.info("grammar mask worker at %d MB: replacing it", self.rss_mb)
            self._outbox.put(None)
            self._process = self._outbox = None
            self.rss_mb = 0

    def _start(self) -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", WORKER_MODULE], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        outbox.put((self.vocab, self.tokenizer_json, self.settings))
        self._process, self._outbox = process, outbox
        self._sent_grammars = OrderedDict()
        threading.Thread(
            target=self._write, args=(process, outbox), name="mask-writer", daemon=True
        ).start()
        threading.Thread(
            target=self._read, args=(process,), name="mask-reader", daemon=True
        ).start()
        logger.info("grammar mask worker started (pid %d)", process.pid)

    def _write(self, process: subprocess.Popen[bytes], outbox: queue.SimpleQueue[Any]) -> None:
        stdin = process.stdin
        assert stdin is not None
        while True:
            message = outbox.get()
            if message is None:
                break
            try:
                send(stdin, message)
            except (OSError, ValueError):  # the worker died: the reader reports it
                break
        try:
            stdin.close()
        except OSError:
            pass

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        stdout = process.stdout
        assert stdout is not None
        while True:
            try:
                sid, seq, mask, forced, done, error, rss_mb = receive(stdout)
            except (EOFError, OSError, pickle.UnpicklingError):
                break
            self.rss_mb = rss_mb
            matcher = self._sessions.get(sid)
            if matcher is not None:
                matcher._reply(seq, mask, forced, done, error)
            if self.on_reply is not None:
                self.on_reply()
        self._lost(process)

    def _lost(self, process: subprocess.Popen[bytes]) -> None:
        """The worker exited: fail its sessions; the next ``open`` starts another."""
        with self._lock:
            if self._process is not process:
                return
            if self._outbox is not None:
                self._outbox.put(None)
            self._process = self._outbox = None
            sessions, self._sessions = self._sessions, {}
        code = process.poll()
        if sessions:
            logger.error(
                "grammar mask worker exited (code %s) with %d requests", code, len(sessions)
            )
        for matcher in sessions.values():
            matcher._reply(matcher._sent, None, [], False, "grammar: the mask worker exited")
        if self.on_reply is not None:
            self.on_reply()

    def shutdown(self) -> None:
        with self._lock:
            process, outbox = self._process, self._outbox
            self._process = self._outbox = None
        if outbox is not None:
            outbox.put(None)
        if process is not None:
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
