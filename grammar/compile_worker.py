"""A compile worker process: ``python -m radixgen.grammar.compile_worker`` (see ``workers.py``).

Reads the vocabulary and the compiler's settings, then compiles each request it reads and
answers with the grammar (pickled on its own, so that one that cannot be is that request's
``GrammarError``), or its ``GrammarError``, and the peak memory of that task.

The front ends recurse once per nesting level of the spec (about six Python frames per
level of a JSON Schema object), so Python's default limit of 1,000 frames would refuse
objects nested ~160 deep. Nothing but compiles runs in this process, so it raises the limit
to ``RECURSION_LIMIT`` and compiles on a thread whose stack (``STACK_BYTES``, reserved, not
committed) holds that many frames: a 300-deep schema compiles, and a deeper one still ends
as ``GrammarError("nested too deeply")``, never as a crash.
"""

from __future__ import annotations

import gc
import pickle
import resource
import sys
import threading
from typing import Any

from .compiler import GrammarCompiler
from .errors import GrammarError
from .workers import JsonSpec, receive, run_when_idle, send, send_bytes

RECURSION_LIMIT = 50_000
STACK_BYTES = 1 << 30


def main() -> None:
    sys.setrecursionlimit(RECURSION_LIMIT)
    threading.stack_size(STACK_BYTES)
    worker = threading.Thread(target=_serve, name="grammar-compile")
    worker.start()
    worker.join()


def _serve() -> None:
    run_when_idle()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies on the pipe
    try:
        vocab, settings = receive(stdin)
    except EOFError:  # the server stopped before it sent the vocabulary
        return
    compiler = GrammarCompiler(vocab, max_workers=1, **settings)
    gc.freeze()  # the vocabulary and its tables: compiles' collections need not scan them
    while True:
        try:
            kind, key, spec, options = receive(stdin)
        except EOFError:
            return
        reply: tuple[str, Any]
        reset_peak_rss()
        try:
            if isinstance(spec, JsonSpec):
                spec = spec.load()
            grammar = compiler._build(kind, key, spec, options)
            # pickled here, so that a grammar that cannot be is this request's error
            data = pickle.dumps(grammar, protocol=pickle.HIGHEST_PROTOCOL)
            reply = ("ok", bool(getattr(grammar, "heavy", False)))
        except GrammarError as err:
            reply = ("error", err)
        except Exception as exc:  # a bug: this request fails, the worker goes on
            reply = ("error", GrammarError(f"{kind}: {type(exc).__name__}: {exc}", source=kind))
        send(stdout, (*reply, peak_rss_mb()))
        if reply[0] == "ok":  # then the grammar, as its own frame (no copy into the reply)
            send_bytes(stdout, data)


def reset_peak_rss() -> None:
    """Start this process's peak RSS over from its current RSS (Linux: ``clear_refs``), so
    that each reply reports the peak of its own task."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        pass


def peak_rss_mb() -> int:
    """This process's own peak RSS in MB. Linux's ``ru_maxrss`` starts from the parent's RSS
    at fork and keeps it across exec, so a worker of a 5 GB server would report 5 GB after
    its first task; ``VmHWM`` belongs to this process's own address space."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // (1 << 20) if sys.platform == "darwin" else peak // 1024  # bytes on macOS


if __name__ == "__main__":
    main()
