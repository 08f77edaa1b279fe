"""The mask worker process: ``python -m radixgen.grammar.mask_worker`` (see ``remote.py``).

Reads the vocabulary, the tokenizer (its JSON) and the settings, then serves messages in
order: ``open`` a session on a grammar (sent pickled the first time its key is used),
``accept`` a token, ``close`` a session, ``forget`` a grammar. Each ``open`` and ``accept``
is answered with ``(session, seq, mask row, forced ids, can finish, error, RSS MB)``: the
state's mask after the token and after the tokens jump-forward takes, as ``constrained.py``
takes them for a local matcher, and this process's memory.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from .errors import GrammarError
from .tokens.table import encode_row
from .workers import receive, send


def main() -> None:
    os.nice(10)  # the engine's decode steps come first when the cores are all busy
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies on the pipe
    try:
        vocab, tokenizer_json, settings = receive(stdin)
    except EOFError:
        return
    tokenizer = HFTokenizer.from_str(tokenizer_json)
    gc.freeze()
    server = _Server(vocab, tokenizer, **settings)
    while True:
        try:
            message = receive(stdin)
        except EOFError:
            return
        reply = server.handle(message)
        if reply is not None:
            send(stdout, (*reply, rss_mb()))


def rss_mb() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20
    except (OSError, ValueError, IndexError):
        return 0


class _Server:
    def __init__(
        self, vocab: Any, tokenizer: HFTokenizer, *, jump_forward: bool, max_forced: int
    ) -> None:
        self.vocab = vocab
        self.tokenizer = tokenizer
        self.eos = frozenset(vocab.eos_token_ids)
        self.jump_forward = jump_forward
        self.max_forced = max_forced
        self.grammars: dict[tuple[str, str, str], Any] = {}
        self.sessions: dict[int, Any] = {}
        self.failed: dict[int, str] = {}

    def handle(self, message: tuple[Any, ...]) -> tuple[Any, ...] | None:
        kind = message[0]
        if kind == "close":
            self.sessions.pop(message[1], None)
            self.failed.pop(message[1], None)
            return None
        if kind == "forget":
            self.grammars.pop(message[1], None)
            return None
        if kind == "open":
            _, sid, key, payload = message
            return self._answer(sid, 1, lambda: self._open(sid, key, payload))
        _, sid, seq, token_id = message
        return self._answer(sid, seq, lambda: self._accept(sid, token_id))

    def _open(self, sid: int, key: tuple[str, str, str], payload: bytes | None) -> list[int]:
        grammar = self.grammars.get(key)
        if grammar is None:
            if payload is None:
                raise RuntimeError(f"no grammar {key[0]} for session {sid}")
            grammar = pickle.loads(payload)
            grammar.attach(self.vocab)
            self.grammars[key] = grammar
        self.sessions[sid] = grammar.matcher()
        return []

    def _accept(self, sid: int, token_id: int) -> list[int]:
        """``Constraints.accept`` for a local matcher, on this session's."""
        matcher = self.sessions[sid]
        if token_id in self.eos:
            matcher.accept_token(token_id)
            return []
        if not matcher.accept_token(token_id):
            raise AssertionError(f"sampled token {token_id} was not allowed by the grammar mask")
        if not self.jump_forward:
            return []
        text = matcher.forced_text()
        forced: list[int] = []
        if text:
            for forced_id in self.tokenizer.encode(text, add_special_tokens=False).ids[
                : self.max_forced
            ]:
                if not matcher.accept_token(forced_id):
                    break
                forced.append(forced_id)
        return forced

    def _answer(self, sid: int, seq: int, step: Any) -> tuple[Any, ...]:
        error = self.failed.get(sid)
        forced: list[int] = []
        if error is None:
            try:
                forced = step()
                matcher = self.sessions[sid]
                return (
                    sid,
                    seq,
                    encode_row(matcher.current_mask()),
                    forced,
                    matcher.can_finish(),
                    None,
                )
            except GrammarError as exc:
                error = f"grammar: {exc}"
            except Exception as exc:  # a fault in this request's grammar ends this request only
                error = f"internal error in the grammar: {type(exc).__name__}: {exc}"
            self.failed[sid] = error
        return (sid, seq, None, [], False, error)


if __name__ == "__main__":
    main()
