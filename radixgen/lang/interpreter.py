"""The interpreter: each program state's ops run in order on a worker thread, states in parallel.

``s += expr`` only queues ``expr``; reading the state (``s[name]``, ``s.text()``, ``fork``) waits
for the queue to drain. So a program body runs ahead of its generations, and the branches of a
fork (each with its own executor) generate concurrently and batch in the engine::

    body thread      s += a; s += gen("x"); f = s.fork(2); f[0] += gen("y"); f[1] += gen("z"); f.join()
    s's worker            a    gen x ──────┘(sync)
    f[0]'s worker                                 gen y ─────────────┐
    f[1]'s worker                                 gen z ─────────────┴ join waits for both

A worker exists only while its queue is non-empty; an op that raises drops the rest of the
queue and the exception is re-raised to whoever waits next (``sync``).
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from typing import Any

from ..sampling_params import SamplingParams
from .backends.base import Backend, CallMeta, Prompt
from .chat_template import RoleMarkers
from .ir import Expr, Gen, RoleBegin, RoleEnd, Select, Text, flatten


class Trace:
    """What a program state holds: its text, role blocks, variables and per-call token counts.

    Written only by the state's worker; every access holds ``cond`` (also notified on change,
    which is what ``text_iter`` waits on).
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.text = ""
        self.messages: list[dict[str, str]] = []
        self.role: str | None = None
        self.role_start = 0  # where the open role block's content starts in ``text``
        self.has_loose_text = False
        self.variables: dict[str, Any] = {}
        self.partial: dict[str, str] = {}  # variables being generated (streaming)
        self.calls: list[CallMeta] = []

    def fork_copy(self) -> Trace:
        """A branch: same text, roles and variables; its own lock and (empty) call list."""
        with self.cond:
            branch = copy.copy(self)
            branch.cond = threading.Condition()
            branch.messages = [dict(m) for m in self.messages]
            branch.variables = dict(self.variables)
            branch.partial, branch.calls = {}, []
            return branch

    def append(self, text: str, var: str | None = None) -> None:
        if not text:
            return
        with self.cond:
            self.text += text
            self.has_loose_text |= self.role is None
            if var is not None:
                self.partial[var] = self.partial.get(var, "") + text
            self.cond.notify_all()

    def prompt(self) -> Prompt:
        with self.cond:
            content = self.text[self.role_start :] if self.role is not None else ""
            return Prompt(
                self.text, [dict(m) for m in self.messages], self.role, content, self.has_loose_text
            )

    def record(self, name: str | None, value: Any, meta: CallMeta) -> None:
        with self.cond:
            meta.name = name
            self.calls.append(meta)
            if name is not None:
                self.variables[name] = value
                self.partial.pop(name, None)
            self.cond.notify_all()


class Executor:
    """Runs one state's ops in submission order against ``backend``."""

    def __init__(
        self, backend: Backend, trace: Trace, defaults: SamplingParams, stream: bool
    ) -> None:
        self.backend = backend
        self.trace = trace
        self.defaults = defaults
        self.stream = stream
        self._pending: deque[Expr] = deque()
        self._active = False
        self._error: BaseException | None = None
        self._markers: RoleMarkers | None = None

    def fork(self, trace: Trace) -> Executor:
        branch = Executor(self.backend, trace, self.defaults, self.stream)
        branch._markers = self._markers
        return branch

    # ------------------------------------------------------------------ queue
    def submit(self, expr: Expr) -> None:
        with self.trace.cond:
            self._pending.extend(flatten(expr))
            if not self._active:
                self._active = True
                threading.Thread(target=self._drain, name="radixgen-program", daemon=True).start()

    @property
    def idle(self) -> bool:
        """True when nothing is queued or running (call with ``trace.cond`` held)."""
        return not self._active

    def sync(self) -> None:
        """Wait until every submitted op ran; re-raise the first failure (once)."""
        with self.trace.cond:
            self.trace.cond.wait_for(lambda: not self._active)
            error, self._error = self._error, None
        if error is not None:
            raise error

    def fail(self, error: BaseException) -> None:
        """Record an error from outside the ops (the program body); the next ``sync`` raises it."""
        with self.trace.cond:
            self._error = self._error or error
            self.trace.cond.notify_all()

    def _drain(self) -> None:
        while True:
            with self.trace.cond:
                if not self._pending or self._error is not None:
                    self._pending.clear()
                    self._active = False
                    self.trace.cond.notify_all()
                    return
                expr = self._pending.popleft()
            try:
                self._execute(expr)
            except BaseException as exc:  # handed to the next sync()
                with self.trace.cond:
                    self._error = exc

    # ------------------------------------------------------------------ ops
    def _execute(self, expr: Expr) -> None:
        if isinstance(expr, Text):
            self.trace.append(expr.value)
        elif isinstance(expr, Gen):
            self._gen(expr)
        elif isinstance(expr, Select):
            self._select(expr)
        elif isinstance(expr, RoleBegin):
            self._role_begin(expr.role)
        elif isinstance(expr, RoleEnd):
            self._role_end(expr.role)
        else:
            raise TypeError(f"cannot execute {type(expr).__name__}")

    def _gen(self, expr: Gen) -> None:
        params = expr.params(self.defaults)
        on_text = (lambda piece: self.trace.append(piece, expr.name)) if self.stream else None
        done = self.backend.generate(self.trace.prompt(), params, on_text)
        if not self.stream:
            self.trace.append(done.text)
        self.trace.record(expr.name, done.text, done.meta)

    def _select(self, expr: Select) -> None:
        chosen = self.backend.select(self.trace.prompt(), list(expr.choices))
        value = expr.choices[chosen.index]
        self.trace.append(value)
        chosen.meta.extra["choice"] = value
        self.trace.record(expr.name, value, chosen.meta)

    def _role_begin(self, role: str) -> None:
        trace, markers = self.trace, self.markers()
        with trace.cond:
            if trace.role is not None:
                raise ValueError(
                    f"{role}(): role blocks do not nest; the {trace.role!r} block is still open"
                )
            opening = markers.preamble if not trace.text and role != "system" else ""
            trace.text += opening + markers.prefix(role)
            trace.role, trace.role_start = role, len(trace.text)
            trace.cond.notify_all()

    def _role_end(self, role: str) -> None:
        trace, markers = self.trace, self.markers()
        with trace.cond:
            if trace.role != role:
                raise ValueError(
                    f"{role}_end(): no {role!r} block is open (open block: {trace.role!r})"
                )
            trace.messages.append({"role": role, "content": trace.text[trace.role_start :]})
            trace.text += markers.suffix(role)
            trace.role = None
            trace.cond.notify_all()

    def markers(self) -> RoleMarkers:
        if self._markers is None:
            self._markers = self.backend.role_markers()
        return self._markers
