"""Compiled grammars and their per-request matchers.

A ``CompiledGrammar`` is shared (cached by the compiler, used by many requests); a
``GrammarMatcher`` is one request's position in it, with a history for rollback. Masks and
DFA states are computed on first use and kept in the grammar, so later requests with the
same grammar find them ready.

Jump-forward: ``forced_text()`` is the text every match must continue with from here. The
engine may tokenize it and feed the ids to ``accept_token``; because the automaton works on
bytes, *any* tokenization of the forced text is accepted. Bytes that end mid-character are
left out of ``forced_text()`` (they are in ``forced_bytes()``). The boundary token is the
caveat: the model would often have written the end of the forced text merged with what
follows (``"name": "`` + ``J`` as one token), so an engine that wants the model's own
tokenization can hold back the last forced token and let the model write it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from .errors import GrammarError
from .lexer.automaton import DEAD
from .lexer.native import DFA
from .tokens.index import MaskIndex
from .tokens.vocabulary import Vocabulary
from .workers import DeferredCall

if TYPE_CHECKING:  # compile workers never fill a bitmask: they do not load torch (~180 MB)
    import torch

S = TypeVar("S")  # a matcher's automaton state
# A grammar that computed a mask this slowly at warm-up is ``heavy``: its matchers run in the
# mask worker process (``remote.py``), where first visits do not stall a decode step.
HEAVY_MASK_S = 0.02


class CompiledGrammar:
    """A grammar compiled against one vocabulary: lazy DFA + cached token masks.

    Thread-safe to share; ``matcher()`` gives an independent cursor for one request.
    """

    def __init__(
        self,
        *,
        kind: str,
        key: tuple[str, str, str],
        dfa: DFA,
        vocab: Vocabulary,
        regex: str | None = None,
        canonical: Callable[[Any], str] | None = None,
    ) -> None:
        self.kind = kind
        self.key = key
        self.dfa = dfa
        self.vocab = vocab
        self.regex = regex
        self.index = MaskIndex(dfa, vocab)
        self._canonical = canonical
        self.heavy = False  # judged by ``warm_up``

    def matcher(self) -> GrammarMatcher:
        return GrammarMatcher(self)

    def __getstate__(self) -> dict:
        """Pickled without the vocabulary (compile workers send grammars back)."""
        state = self.__dict__.copy()
        state["vocab"] = None
        state["_canonical"] = DeferredCall.wrap(self._canonical)  # unpickled when called
        return state

    def attach(self, vocab: Vocabulary) -> None:
        """Give an unpickled grammar its vocabulary (the receiver's own object)."""
        self.vocab = vocab
        self.index.attach(vocab)

    def canonical_json(self, instance: Any) -> str:
        """How this grammar writes ``instance`` (whitespace, property order); json grammars only."""
        if self._canonical is None:
            raise GrammarError(
                f"grammar: canonical_json needs a json_schema grammar, this one is {self.kind!r}",
                source="grammar",
            )
        return self._canonical(instance)

    def warm_up(self, budget_s: float = 0.0, *, rare: bool = False) -> int:
        """Compute the start state's mask, then more breadth-first for up to ``budget_s``
        (done at compile time, off the engine thread): the likely states, and the rare ones
        (undeclared properties, escapes) only if ``rare``. A mask slower than ``HEAVY_MASK_S``
        makes the grammar ``heavy`` and ends the precompute there: a heavy grammar's masks
        are computed in the mask worker, as its requests need them. Returns the number of
        masks built."""
        self.index.mask(self.dfa.start)
        self.index.slowest_s = 0.0  # the start's mask is computed here, whatever it costs
        built = 1 + (
            self.index.precompute(budget_s, rare=rare, stop_over_s=HEAVY_MASK_S)
            if budget_s > 0
            else 0
        )
        self.heavy = self.index.slowest_s > HEAVY_MASK_S
        return built

    @property
    def num_states(self) -> int:
        return self.dfa.num_states

    def nbytes(self) -> int:
        """About the memory it holds now (masks and automaton grow as requests walk it):
        what the compile cache bounds."""
        return self.index.nbytes() + self.dfa.nbytes()

    def __repr__(self) -> str:
        return f"CompiledGrammar(kind={self.kind!r}, states={self.num_states}, classes={self.dfa.num_classes})"


class TokenMatcher(Generic[S]):
    """What every matcher offers the engine: a request's cursor in a compiled grammar.

    The history holds one automaton state per accepted step (a token, an ``accept_bytes``
    call, or ``None`` for an accepted EOS), so ``rollback(n)`` undoes the last n steps.
    Subclasses say how a state steps over bytes (``_step``), whether it accepts, its mask
    and its forced bytes; the rest of the contract is here.
    """

    _token_bytes: tuple[bytes | None, ...]
    _eos: frozenset[int]
    _history: list[S | None]
    _view_of: torch.Tensor | None = None  # the bitmask last filled, and its numpy view
    _view: np.ndarray | None = None

    def _step(self, state: S, data: bytes) -> S | None:
        """The state after ``data``, or None if the grammar rejects it."""
        raise NotImplementedError

    def _accepts(self, state: S) -> bool:
        raise NotImplementedError

    @property
    def state(self) -> S:
        """Current automaton state (stays the last real state after EOS)."""
        return next(s for s in reversed(self._history) if s is not None)

    @property
    def num_steps(self) -> int:
        """Steps that ``rollback`` can undo."""
        return len(self._history) - 1

    def accept_token(self, token_id: int) -> bool:
        """Advance by one token; False (and no change) if the grammar rejects it."""
        token_id = int(token_id)
        if token_id in self._eos:
            if not (self.is_terminated() or self.is_accepting()):
                return False
            self._history.append(None)
            return True
        if self.is_terminated() or not 0 <= token_id < len(self._token_bytes):
            return False
        data = self._token_bytes[token_id]
        return data is not None and self._advance(data)

    def accept_bytes(self, data: bytes) -> bool:
        """Advance by raw bytes as one step (all or nothing)."""
        return not self.is_terminated() and self._advance(bytes(data))

    def accept_string(self, text: str) -> bool:
        """Advance by ``text`` (its UTF-8 bytes) as one step (all or nothing)."""
        return self.accept_bytes(text.encode("utf-8"))

    def _advance(self, data: bytes) -> bool:
        nxt = self._step(self.state, data)
        if nxt is None:
            return False
        self._history.append(nxt)
        return True

    def rollback(self, num_steps: int = 1) -> None:
        """Undo the last ``num_steps`` accepted steps (tokens, byte strings or EOS)."""
        if not 0 <= num_steps <= self.num_steps:
            raise ValueError(f"rollback: can undo 0..{self.num_steps} steps, got {num_steps}")
        if num_steps:
            del self._history[-num_steps:]

    def reset(self) -> None:
        del self._history[1:]

    def is_terminated(self) -> bool:
        """True once EOS has been accepted."""
        return self._history[-1] is None

    def is_accepting(self) -> bool:
        """True if the text so far is a complete match (EOS allowed now)."""
        return self.is_terminated() or self._accepts(self.state)

    def can_finish(self) -> bool:
        """True if the output is complete and nothing but EOS may follow (stop without sampling)."""
        raise NotImplementedError

    def current_mask(self) -> np.ndarray:
        raise NotImplementedError

    def forced_bytes(self) -> bytes:
        raise NotImplementedError

    def fill_bitmask(self, bitmask: torch.Tensor, row: int = 0) -> None:
        """Write this state's allowed tokens into ``bitmask[row]`` (int32 ``[batch, words]``).

        Bit j of word w allows token 32*w + j. EOS is allowed only where the grammar can end
        (and alone once terminated); special tokens never are; words past the vocabulary are
        zeroed. Costs one row copy when the state's mask is cached, else computes it once.
        Keep the bitmask on the CPU (pinned, and reused across steps, is best): a GPU
        tensor works but costs a transfer per row.
        """
        mask = self.current_mask()
        view = self._numpy_view(bitmask)
        words = mask.shape[0]
        if bitmask.shape[-1] < words:
            raise ValueError(
                f"fill_bitmask: rows have {bitmask.shape[-1]} words, the vocabulary needs {words}"
            )
        if view is None:
            import torch

            bitmask[row, :words].copy_(torch.from_numpy(mask.copy()))  # cached masks: read-only
            bitmask[row, words:].zero_()
        else:
            view[row, :words] = mask
            view[row, words:] = 0

    def _numpy_view(self, bitmask: torch.Tensor) -> np.ndarray | None:
        """A numpy view of a CPU bitmask (cached for the tensor last seen), else None."""
        if bitmask is self._view_of:
            return self._view
        import torch

        if bitmask.dtype != torch.int32 or bitmask.dim() != 2:
            raise ValueError(
                "fill_bitmask: expected an int32 [batch, words] tensor, "
                f"got {bitmask.dtype} {tuple(bitmask.shape)}"
            )
        view = bitmask.numpy() if bitmask.device.type == "cpu" else None
        self._view_of, self._view = bitmask, view
        return view

    def allowed_token_ids(self) -> list[int]:
        """Every token id ``accept_token`` would accept now (for tests and debugging)."""
        bits = np.unpackbits(self.current_mask().view(np.uint8), bitorder="little")
        return np.flatnonzero(bits[: len(self._token_bytes)]).tolist()

    def forced_text(self) -> str:
        """``forced_bytes()`` as text, without a trailing incomplete character (jump-forward)."""
        data = self.forced_bytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            return data[: err.start].decode("utf-8", errors="ignore")


class GrammarMatcher(TokenMatcher[int]):
    """One request's cursor in a ``CompiledGrammar``. Not thread-safe (one request, one thread).

    States and masks the compiler did not precompute are built on first use, so
    ``accept_token`` / ``fill_bitmask`` can raise ``GrammarError`` if that growth passes the
    compiler's ``max_states`` (a grammar too large to decode): abort the request then.
    """

    def __init__(self, grammar: CompiledGrammar) -> None:
        self.grammar = grammar
        self._dfa = grammar.dfa
        self._token_bytes = grammar.vocab.token_bytes
        self._eos = frozenset(grammar.vocab.eos_token_ids)
        self._history: list[int | None] = [grammar.dfa.start]

    def _step(self, state: int, data: bytes) -> int | None:
        with self._dfa.lock:
            nxt = self._dfa.walk(state, data)
        return None if nxt == DEAD else nxt

    def _accepts(self, state: int) -> bool:
        return self._dfa.accepting[state]

    def can_finish(self) -> bool:
        """True if the output is complete and nothing but EOS may follow (stop without sampling)."""
        if self.is_terminated():
            return True
        state = self.state
        return self._dfa.accepting[state] and self.grammar.index.num_allowed(state) == 0

    def current_mask(self) -> np.ndarray:
        """The packed row of the current state (int32 [words], shared: do not modify)."""
        state = self._history[-1]
        if state is None:
            return self.grammar.index.eos_only()
        return self.grammar.index.mask(state)

    def forced_bytes(self) -> bytes:
        """Bytes every match continues with from here (empty if terminated or a choice exists)."""
        if self.is_terminated():
            return b""
        with self._dfa.lock:
            return self._dfa.forced_bytes(self.state)
