"""ProgramState: the ``s`` a program writes to and reads from; ForkGroup: the branches of ``s.fork(n)``.

Writes (``s += expr``) are queued on the state's executor; reads (``s[name]``, ``text()``,
``messages()``, ``meta``) wait for them. See ``radixgen.lang.interpreter``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

from ..sampling_params import SamplingParams
from .backends.base import Backend
from .interpreter import Executor, Trace
from .ir import ROLES, RoleBegin, RoleEnd, to_expr

POLL_S = 0.1  # text_iter re-checks completion this often


class ProgramState:
    """One run of a program (or one branch of a fork)."""

    def __init__(self, executor: Executor, body_done: threading.Event) -> None:
        self._executor = executor
        self._trace = executor.trace
        self._body_done = body_done  # set when the program function has returned
        self._forks: list[ProgramState] = []
        self.ret_value: Any = None

    @classmethod
    def start(
        cls, backend: Backend, defaults: SamplingParams, stream: bool = False
    ) -> ProgramState:
        return cls(Executor(backend, Trace(), defaults, stream), threading.Event())

    # ------------------------------------------------------------------ writing
    def __iadd__(self, other: Any) -> ProgramState:
        self._executor.submit(to_expr(other))
        return self

    @contextmanager
    def role(self, name: str):
        """``with s.role("user"): s += ...`` (also ``s.system()``, ``s.user()``, ``s.assistant()``)."""
        if name not in ROLES:
            raise ValueError(f"role: expected one of {', '.join(ROLES)}, got {name!r}")
        self._executor.submit(RoleBegin(name))
        try:
            yield self
        finally:
            self._executor.submit(RoleEnd(name))

    def system(self):
        return self.role("system")

    def user(self):
        return self.role("user")

    def assistant(self):
        return self.role("assistant")

    def set_var(self, name: str, value: Any) -> None:
        self.sync()
        with self._trace.cond:
            self._trace.variables[name] = value

    def fork(self, size: int = 1) -> ForkGroup:
        """``size`` branches continuing this state's text, roles and variables.

        Waits for the queued ops, then (for ``size > 1``) asks the backend to cache the shared
        prefix so every branch's first call reuses it instead of recomputing it.
        """
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"fork: expected a size >= 1, got {size!r}")
        self.sync()
        if size > 1:
            meta = self._executor.backend.cache_prefix(self._trace.prompt())
            if meta is not None:
                self._trace.record(None, None, meta)
        branches = []
        for _ in range(size):
            trace = self._trace.fork_copy()
            branches.append(ProgramState(self._executor.fork(trace), self._body_done))
        self._forks.extend(branches)
        return ForkGroup(self, branches)

    # ------------------------------------------------------------------ reading
    def sync(self) -> ProgramState:
        """Wait for every queued op; re-raise the first that failed."""
        self._executor.sync()
        return self

    def __getitem__(self, name: str) -> Any:
        self.sync()
        with self._trace.cond:
            if name not in self._trace.variables:
                known = ", ".join(sorted(self._trace.variables)) or "none"
                raise KeyError(f"no variable {name!r} in this program state (variables: {known})")
            return self._trace.variables[name]

    def get_var(self, name: str) -> Any:
        return self[name]

    def __contains__(self, name: str) -> bool:
        self.sync()
        return name in self._trace.variables

    def variables(self) -> dict[str, Any]:
        self.sync()
        return dict(self._trace.variables)

    def text(self) -> str:
        self.sync()
        return self._trace.text

    def messages(self) -> list[dict[str, str]]:
        """The completed role blocks, as chat messages."""
        self.sync()
        return [dict(m) for m in self._trace.messages]

    def get_meta_info(self, name: str) -> dict[str, Any]:
        """Token counts of the call that produced variable ``name`` (the last one, if several)."""
        self.sync()
        for call in reversed(self._trace.calls):
            if call.name == name:
                return call.as_dict()
        raise KeyError(f"no gen/select call named {name!r} in this program state")

    @property
    def meta(self) -> dict[str, Any]:
        """Totals over this state's calls and its forks' (``calls``: this state's own, in order)."""
        self.sync()
        calls = list(self._trace.calls)
        forks = [f.meta for f in self._forks]
        totals = {
            key: sum(getattr(c, key) for c in calls) + sum(f[key] for f in forks)
            for key in ("prompt_tokens", "completion_tokens", "cached_tokens")
        }
        return {
            **totals,
            "num_calls": len(calls) + sum(f["num_calls"] for f in forks),
            "calls": [c.as_dict() for c in calls],
            "forks": forks,
        }

    def text_iter(self, var_name: str | None = None) -> Iterator[str]:
        """Yield the text (or variable ``var_name``'s text) as it is produced, until the program ends.

        Pieces join to ``text()`` (or to ``state[var_name]``). Generated pieces arrive token by
        token when the program runs with ``stream=True``; otherwise each call's text at once.
        """
        pos = 0
        while True:
            with self._trace.cond:
                self._trace.cond.wait_for(partial(self._has_more, var_name, pos), timeout=POLL_S)
                chunk = self._source(var_name)[pos:]
                finished = self._finished(var_name)
            pos += len(chunk)
            if chunk:
                yield chunk
            elif finished:
                break
        self.sync()

    def _has_more(self, var_name: str | None, seen: int) -> bool:
        return len(self._source(var_name)) > seen or self._finished(var_name)

    def _source(self, var_name: str | None) -> str:
        if var_name is None:
            return self._trace.text
        value = self._trace.variables.get(var_name, self._trace.partial.get(var_name, ""))
        return value if isinstance(value, str) else str(value)

    def _finished(self, var_name: str | None) -> bool:
        if var_name is not None and var_name in self._trace.variables:
            return True
        return self._body_done.is_set() and self._executor.idle

    def __repr__(self) -> str:
        with self._trace.cond:
            return f"ProgramState(text={self._trace.text[-60:]!r}, variables={sorted(self._trace.variables)})"


class ForkGroup(Sequence[ProgramState]):
    """The branches of ``s.fork(n)``: index them, ``+=`` to all, ``join()`` back into ``s``."""

    def __init__(self, parent: ProgramState, branches: list[ProgramState]) -> None:
        self.parent = parent
        self.branches = branches
        self._fork_points = [len(b._trace.text) for b in branches]
        self._inherited = set(parent._trace.variables)

    def __getitem__(self, index):
        return self.branches[index]

    def __len__(self) -> int:
        return len(self.branches)

    def __iadd__(self, other: Any) -> ForkGroup:
        for branch in self.branches:
            branch += other
        return self

    def sync(self) -> ForkGroup:
        for branch in self.branches:
            branch.sync()
        return self

    def join(self, mode: str = "gather_variable") -> None:
        """Wait for every branch, then bring results into the parent.

        ``gather_variable``: each variable a branch created becomes ``parent[name] = [value per
        branch]``. ``concate_and_append``: the text each branch added is appended to the parent.
        """
        self.sync()
        if mode == "gather_variable":
            names = dict.fromkeys(
                n for b in self.branches for n in b.variables() if n not in self._inherited
            )
            for name in names:
                self.parent.set_var(name, [b._trace.variables.get(name) for b in self.branches])
        elif mode == "concate_and_append":
            self.parent += "".join(
                b._trace.text[p:] for b, p in zip(self.branches, self._fork_points)
            )
        else:
            raise ValueError(
                f"join: mode must be 'gather_variable' or 'concate_and_append', got {mode!r}"
            )
