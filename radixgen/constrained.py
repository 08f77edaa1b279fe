"""Request <-> grammar glue: compile at submit, bitmask rows per step, accept tokens, jump-forward.

Grammars compile in the compiler's thread pool. ``start`` waits for the result on the *caller's*
thread (never the engine thread), so an unsupported schema is a ``GrammarError`` (a
``ValueError``) at submit time while running requests keep decoding.

JSON Schema objects are closed by default: an object without ``additionalProperties`` (or
``patternProperties``) gets no undeclared properties, as XGrammar (vLLM's and SGLang's default
engine) does, since the schemas pydantic makes for instructor, langchain and openai-agents
never want them; the output still validates against the schema. A schema that wants extras says
so (``additionalProperties: true`` or a schema).

Grammars whose first-visit masks are slow (``heavy``: a closed object of thousands of optional
properties) run in the mask worker process (``grammar/remote.py``): the request's matcher is a
``RemoteMatcher``, and ``hold`` tells the engine when such a request cannot be sampled yet
(its reply is not in: it sits out steps, its batch-mates go on) or has something to do first
(tokens jump-forward took, a complete grammar, an error).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, cast

import torch

from .grammar import GrammarCompiler
from .grammar.backends import ExternalCompiler, make_compiler
from .grammar.cfg.matcher import CfgGrammar
from .grammar.errors import GrammarError
from .grammar.matcher import CompiledGrammar, TokenMatcher
from .grammar.remote import MaskWorker, RemoteMatcher
from .grammar.workers import PickledGrammar
from .kernels import allocate_token_bitmask
from .request import Req
from .sampling_params import SamplingParams
from .thinking import ThinkingMarks, ThinkingMatcher
from .tokenizer import Tokenizer

logger = logging.getLogger(__name__)

MAX_FORCED_TOKENS = 64  # jump-forward at most this many tokens per step
# a request's error when its constraint allows no token: the client's constraint, not a fault
DEAD_END = (
    "grammar: no token of the model's vocabulary continues the constraint here "
    "(it requires text this tokenizer cannot produce)"
)


class Constraints:
    def __init__(
        self,
        tokenizer: Tokenizer,
        vocab_size: int,
        device: torch.device,
        jump_forward: bool = True,
        backend: str = "radixgen",
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.device = device
        self.jump_forward = jump_forward
        self.backend = backend
        self._compiler: GrammarCompiler | ExternalCompiler | None = None
        self._compiler_lock = threading.Lock()
        # "auto": heavy grammars run in the mask worker; "always" / "never" (tests, benchmarks)
        self.remote = "auto"
        self.on_remote_reply: Callable[[], None] | None = None  # wakes the engine loop
        self._mask_worker: MaskWorker | None = None
        # the reasoning markers of a thinking model (the engine sets them): constraints then
        # hold what follows the reasoning, and max_thinking_tokens bounds it
        self.thinking: ThinkingMarks | None = None

    @property
    def compiler(self) -> GrammarCompiler | ExternalCompiler:
        """The engine's grammar compiler, of its ``grammar_backend`` (built on first use, or
        by ``start_compiler``: it indexes the vocabulary and starts radixgen's compile
        worker processes; a back end that is not installed is a ``GrammarError``)."""
        with self._compiler_lock:
            if self._compiler is None:
                self._compiler = make_compiler(
                    self.backend, self.tokenizer, self.vocab_size, isolate=True, defer_heavy=True
                )
            return self._compiler

    def start_compiler(self) -> None:
        """Build the compiler in the background (the first constrained request waits for it)."""

        def build() -> None:
            try:
                self.compiler  # noqa: B018 - built for its side effect
            except Exception as exc:  # reported again to the first request that needs it
                logger.warning("grammar compiler: %s", exc)

        threading.Thread(target=build, name="grammar-start", daemon=True).start()

    def start(self, req: Req, params: SamplingParams) -> None:
        """Compile ``params``' constraint (cached) and attach a matcher; raises ``GrammarError``.
        With a thinking model the matcher is a ``ThinkingMatcher`` (the reasoning first) where
        the output may reason and a constraint or ``max_thinking_tokens`` is given."""
        constraint = params.constraint
        grammar = self._compile(constraint) if constraint is not None else None
        thinking = self.thinking
        if thinking is not None and (grammar is not None or params.max_thinking_tokens is not None):
            opening = thinking.opening(self.tokenizer, req.prompt_ids)
            if opening != "off":
                # a grammar after reasoning runs here, also a heavy one: its first masks come
                # once the reasoning ends, not in the mask worker
                inner = grammar.matcher() if grammar is not None else None
                req.matcher = ThinkingMatcher(thinking, opening, inner, params.max_thinking_tokens)
                return
        if grammar is None:
            return
        if self._runs_remotely(grammar):
            req.matcher = self._worker().open(grammar)
        else:
            req.matcher = grammar.matcher()

    def _compile(self, constraint: tuple[str, Any]) -> Any:
        kind, spec = constraint  # the compiler's kinds are SamplingParams' constraint fields
        compiler = self.compiler
        if isinstance(compiler, GrammarCompiler) and kind in ("json_schema", "structural_tag"):
            # objects closed by default: no undeclared properties unless the schema asks
            future = compiler.compile_async(kind, spec, strict=True)
        else:
            future = compiler.compile_async(kind, True if kind == "json_object" else spec)
        return future.result()

    def _runs_remotely(self, grammar: Any) -> bool:
        if self.remote == "never" or not isinstance(
            grammar, CfgGrammar | CompiledGrammar | PickledGrammar
        ):
            return False  # another back end's grammar stays here
        return self.remote == "always" or grammar.heavy

    def _worker(self) -> MaskWorker:
        vocab = cast(GrammarCompiler, self.compiler).vocab
        with self._compiler_lock:
            if self._mask_worker is None:
                self._mask_worker = MaskWorker(
                    vocab,
                    self.tokenizer.backend.to_str(),
                    jump_forward=self.jump_forward,
                    max_forced=MAX_FORCED_TOKENS,
                    on_reply=self._on_reply,
                )
            return self._mask_worker

    @property
    def mask_worker_mb(self) -> int:
        """The mask worker's memory (MB) as its last reply said; 0 when none runs."""
        worker = self._mask_worker
        return worker.rss_mb if worker is not None and worker._process is not None else 0

    def _on_reply(self) -> None:
        if self.on_remote_reply is not None:
            self.on_remote_reply()

    def hold(self, req: Req) -> str | None:
        """Whether ``req`` can be sampled now: None (yes), ``"wait"`` (its remote grammar has
        not answered: keep its logits, sample it later) or ``"act"`` (``take_remote`` first:
        forced tokens, a complete grammar or an error; its logits are not needed)."""
        matcher = req.matcher
        if not isinstance(matcher, RemoteMatcher) or req.error is not None:
            return None
        if not matcher.ready:
            return "wait"
        if matcher.error is not None or matcher.forced_ids or matcher.can_finish():
            return "act"
        return None

    def take_remote(self, req: Req) -> tuple[list[int], bool]:
        """(forced token ids to append, whether the grammar is then complete) of a remote
        request ``hold`` said to act on; sets ``req.error`` when its grammar failed."""
        matcher = req.matcher
        assert isinstance(matcher, RemoteMatcher)
        if matcher.error is not None:
            req.error = matcher.error
            return [], False
        forced = matcher.consume_forced()
        return forced, not forced and matcher.can_finish()

    def release(self, req: Req) -> None:
        """``req`` is over: its remote session (if any) is closed."""
        if isinstance(req.matcher, RemoteMatcher):
            req.matcher.close()

    def bitmask(self, reqs: list[Req]) -> tuple[torch.Tensor | None, list[int]]:
        """An int32 bitmask ``[len(reqs), ceil(V/32)]`` with rows filled for constrained requests."""
        rows = [i for i, r in enumerate(reqs) if r.matcher is not None and _masks(r.matcher)]
        if not rows:
            return None, rows
        bitmask = allocate_token_bitmask(len(reqs), self.vocab_size)
        for i in rows:
            matcher = reqs[i].matcher
            assert matcher is not None
            try:
                matcher.fill_bitmask(bitmask, i)
            except GrammarError as exc:  # its automaton outgrew the limits: end this request only
                reqs[i].error = f"grammar: {exc}"
            except Exception as exc:  # any other fault in this row ends this request only too
                reqs[i].error = f"internal error in the grammar: {type(exc).__name__}: {exc}"
            else:
                if not bool(bitmask[i].any()):  # e.g. a character no token of the vocabulary spells
                    reqs[i].error = DEAD_END
        return bitmask.to(self.device, non_blocking=True), rows

    def grammar_prefix(self, req: Req, draft: list[int]) -> list[int]:
        """The longest prefix of ``draft`` that ``req``'s grammar accepts from its state (the
        matcher is left where it was)."""
        matcher = req.matcher
        if matcher is None:
            return draft
        if isinstance(matcher, RemoteMatcher):  # no rollback: it does not draft
            return []
        kept = 0
        try:
            for token_id in draft:
                if not matcher.accept_token(token_id):
                    break
                kept += 1
        except GrammarError:  # a limit reached while drafting: the plain step reports it
            pass
        matcher.rollback(kept)
        return draft[:kept]

    def draft_bitmask(
        self, reqs: list[Req], drafts: list[list[int]]
    ) -> tuple[torch.Tensor | None, list[int]]:
        """Bitmask rows for verifying drafts: request ``i`` gets ``len(drafts[i]) + 1`` rows in
        order, row ``j`` its grammar's mask after the first ``j`` draft tokens (which
        ``grammar_prefix`` accepted). Returns the bitmask and the rows that are filled."""
        if all(r.matcher is None for r in reqs):
            return None, []
        num_rows = sum(len(d) + 1 for d in drafts)
        bitmask = allocate_token_bitmask(num_rows, self.vocab_size)
        rows: list[int] = []
        start = 0
        for req, draft in zip(reqs, drafts):
            matcher = req.matcher
            if isinstance(matcher, RemoteMatcher):
                raise AssertionError("a request whose grammar runs in the mask worker drafted")
            if matcher is not None and req.error is None:
                stepped = 0
                try:
                    for j in range(len(draft) + 1):
                        matcher.fill_bitmask(bitmask, start + j)
                        rows.append(start + j)
                        if j < len(draft):
                            if not matcher.accept_token(draft[j]):
                                raise AssertionError(f"draft token {draft[j]} left the grammar")
                            stepped += 1
                except GrammarError as exc:
                    req.error = f"grammar: {exc}"
                except Exception as exc:
                    req.error = f"internal error in the grammar: {type(exc).__name__}: {exc}"
                else:
                    if not bool(bitmask[start].any()):
                        req.error = DEAD_END
                matcher.rollback(stepped)
            start += len(draft) + 1
        return bitmask.to(self.device, non_blocking=True), rows

    def accept(self, req: Req, token_id: int) -> list[int]:
        """Advance ``req``'s matcher by ``token_id``; return grammar-forced tokens to jump over."""
        matcher = req.matcher
        if matcher is None or req.error is not None:
            return []
        if isinstance(matcher, RemoteMatcher):  # its forced tokens come with the reply
            matcher.accept_token(token_id)
            return []
        try:
            if token_id in self.tokenizer.eos_token_ids:
                matcher.accept_token(token_id)
                return []
            if not matcher.accept_token(token_id):
                raise AssertionError(
                    f"sampled token {token_id} was not allowed by the grammar mask"
                )
            return self._forced_tokens(matcher) if self.jump_forward else []
        except GrammarError as exc:
            req.error = f"grammar: {exc}"
            return []

    def _forced_tokens(self, matcher: TokenMatcher[Any] | ThinkingMatcher) -> list[int]:
        text = matcher.forced_text()
        if not text:
            return []
        accepted = []
        for token_id in self.tokenizer.encode(text)[:MAX_FORCED_TOKENS]:
            if not matcher.accept_token(token_id):
                break
            accepted.append(token_id)
        return accepted

    def finished(self, req: Req) -> bool:
        """True when the grammar is complete and allows nothing but EOS."""
        return req.matcher is not None and req.matcher.can_finish()

    def shutdown(self) -> None:
        if self._compiler is not None and hasattr(self._compiler, "shutdown"):
            self._compiler.shutdown()
        if self._mask_worker is not None:
            self._mask_worker.shutdown()


def _masks(matcher: Any) -> bool:
    """Whether ``matcher`` masks this step (a thinking model's free reasoning does not)."""
    return not isinstance(matcher, ThinkingMatcher) or matcher.needs_mask()
