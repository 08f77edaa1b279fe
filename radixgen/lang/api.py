"""The DSL's public names, spelled as in SGLang so its programs read the same::

@rg.function
def qa(s, question):
    s += rg.system("You are a helpful assistant.")
    s += rg.user(question)
    s += rg.assistant(rg.gen("answer", max_tokens=64, stop="\\n"))

state = qa.run(question="What is 2+2?", backend=rg.Engine(), temperature=0)
state["answer"], state.text(), state.messages(), state.get_meta_info("answer")
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any

from ..sampling_params import SamplingParams
from .backends import Backend, as_backend
from .ir import SGLANG_ALIASES, Concat, Gen, RoleBegin, RoleEnd, Select, sampling_overrides, to_expr
from .state import ProgramState

_default_backend: Backend | None = None  # set_default_backend(); the one process-wide default


def set_default_backend(backend: Any) -> None:
    """Backend for ``run``/``run_batch`` calls that name none (an ``Engine`` is wrapped)."""
    global _default_backend
    _default_backend = as_backend(backend)


def get_default_backend() -> Backend | None:
    return _default_backend


# ---------------------------------------------------------------------- expressions


def gen(name: str | None = None, **options: Any) -> Gen:
    """Generate text into variable ``name``.

    ``options`` are ``SamplingParams`` fields (``max_new_tokens`` or SGLang's ``max_tokens``,
    ``temperature``, ``stop``, ``regex``, ``json_schema``, ``choices``, ...), on top of the
    program's defaults (``run(..., temperature=0)``). Unknown names or bad values raise
    ``ValueError`` here.
    """
    return Gen(name, sampling_overrides(options))


def select(name: str | None = None, choices: list[str] | None = None) -> Select:
    """Append the most likely of ``choices`` and store it in variable ``name``.

    The local engine scores each choice exactly (mean token logprob after the prompt); HTTP
    backends generate greedily under a ``choices`` constraint.
    """
    if (
        not isinstance(choices, (list, tuple))
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise ValueError(
            f"select: choices must be a non-empty list of non-empty strings, got {choices!r}"
        )
    return Select(name, tuple(choices))


def _role(role: str, expr: Any = None) -> Concat:
    body = () if expr is None else (to_expr(expr),)
    return Concat((RoleBegin(role), *body, RoleEnd(role)))


def system(expr: Any = None) -> Concat:
    """A system block around ``expr`` (text, ``gen``, or a ``+`` of them)."""
    return _role("system", expr)


def user(expr: Any = None) -> Concat:
    """A user block around ``expr``."""
    return _role("user", expr)


def assistant(expr: Any = None) -> Concat:
    """An assistant block around ``expr``; a ``gen`` inside writes the reply."""
    return _role("assistant", expr)


def system_begin() -> RoleBegin:
    return RoleBegin("system")


def system_end() -> RoleEnd:
    return RoleEnd("system")


def user_begin() -> RoleBegin:
    return RoleBegin("user")


def user_end() -> RoleEnd:
    return RoleEnd("user")


def assistant_begin() -> RoleBegin:
    return RoleBegin("assistant")


def assistant_end() -> RoleEnd:
    return RoleEnd("assistant")


# ---------------------------------------------------------------------- programs


def function(func: Callable[..., Any]) -> Program:
    """Decorator: ``func(s, ...)`` becomes a program with ``run`` and ``run_batch``."""
    return Program(func)


class Program:
    def __init__(self, func: Callable[..., Any]) -> None:
        self.func = func
        params = list(inspect.signature(func).parameters.values())
        if not params:
            raise TypeError(
                f"@function {func.__name__}: the first parameter must take the program state"
            )
        self._arg_names = {p.name for p in params[1:]}
        self.__name__ = func.__name__
        self.__doc__ = func.__doc__

    def __call__(self, state: ProgramState, *args: Any, **kwargs: Any) -> Any:
        """Run the body on an existing state (to compose programs); use ``run`` to start one."""
        if not isinstance(state, ProgramState):
            raise TypeError(
                f"{self.__name__}: call .run(...) to start a program; calling it directly "
                "needs a program state as the first argument"
            )
        return self.func(state, *args, **kwargs)

    def run(
        self, *args: Any, backend: Any = None, stream: bool = False, **kwargs: Any
    ) -> ProgramState:
        """Run once. Keyword arguments the function does not take and that name sampling options
        (``temperature``, ``max_tokens``, ...) become defaults for every ``gen`` in the program.

        Without ``stream`` it returns when the program has finished (re-raising its error). With
        ``stream=True`` it returns at once; iterate ``state.text_iter()``.
        """
        program_kwargs, defaults = self._split_kwargs(kwargs)
        state = ProgramState.start(_resolve_backend(backend), defaults, stream)
        if stream:
            threading.Thread(
                target=self._body, args=(state, args, program_kwargs), daemon=True
            ).start()
            return state
        self._body(state, args, program_kwargs)
        return state.sync()

    def run_batch(
        self,
        batch_kwargs: list[dict[str, Any]],
        *,
        backend: Any = None,
        num_threads: int | str = "auto",
        progress_bar: bool = False,
        **sampling: Any,
    ) -> list[ProgramState]:
        """Run once per dict of arguments, ``num_threads`` programs at a time; states in input order.

        Programs run concurrently, so their calls batch in the engine. The first program error
        is re-raised after all have finished.
        """
        resolved = _resolve_backend(backend)
        workers = _num_threads(num_threads, len(batch_kwargs))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="radixgen-batch") as pool:
            futures = [
                pool.submit(self.run, backend=resolved, **kwargs, **sampling)
                for kwargs in batch_kwargs
            ]
            if progress_bar:
                from tqdm import tqdm

                for _ in tqdm(
                    as_completed(futures), total=len(futures), desc=self.__name__, unit="prog"
                ):
                    pass
            return [f.result() for f in futures]

    def _body(self, state: ProgramState, args: tuple, kwargs: dict[str, Any]) -> None:
        try:
            state.ret_value = self.func(state, *args, **kwargs)
        except BaseException as exc:
            state._executor.fail(exc)  # surfaces at the next sync / the end of text_iter
            if not state._executor.stream:
                raise
        finally:
            state._body_done.set()

    def _split_kwargs(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], SamplingParams]:
        sampling_names = set(SamplingParams.field_names()) | set(SGLANG_ALIASES)
        options = {
            k: v for k, v in kwargs.items() if k in sampling_names and k not in self._arg_names
        }
        program_kwargs = {k: v for k, v in kwargs.items() if k not in options}
        return program_kwargs, SamplingParams(**sampling_overrides(options))


def _resolve_backend(backend: Any) -> Backend:
    if backend is not None:
        return as_backend(backend)
    if _default_backend is None:
        raise ValueError(
            "no backend: pass backend=rg.Engine() (or a RuntimeEndpoint / OpenAI backend) "
            "or call rg.set_default_backend(...)"
        )
    return _default_backend


def _num_threads(num_threads: int | str, num_programs: int) -> int:
    if num_threads == "auto":
        return max(1, min(num_programs, 64))  # threads mostly wait on the engine
    if not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(
            f"run_batch: num_threads must be 'auto' or an integer >= 1, got {num_threads!r}"
        )
    return num_threads
