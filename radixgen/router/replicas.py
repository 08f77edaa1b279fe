"""Serving through the router: ``radixgen serve --dp N`` (N replicas of ``radixgen serve`` on
local ports, restarted when they die) and ``radixgen router --worker-urls ...`` (hosts started
elsewhere).

Each replica is a whole server (engine, radix cache, HTTP) on ``127.0.0.1``. On CPU it takes
``cores / N`` threads, unless ``--num-threads`` says otherwise. On CUDA it takes its own
``--tp-size`` devices (``CUDA_VISIBLE_DEVICES``). The router waits until every replica answers
``/health``, then listens on ``--host/--port``, so a client polling ``/health`` sees "connection
refused", then 200, as with one server. A replica that exits is marked unhealthy at once, so no
new request goes to it. Its in-flight requests fail with 502, and it is restarted on the same
port; the router's probe brings it back. On SIGTERM/SIGINT the router stops, then the replicas
shut down gracefully.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from uvicorn.server import HANDLED_SIGNALS

from .. import numa
from ..config import EngineConfig
from ..options import to_argv
from ..server.settings import ServerSettings
from .proxy import Router, create_router_app
from .settings import RouterSettings

logger = logging.getLogger("radixgen.router")

READY_TIMEOUT_S = 900.0  # a replica loads its model within this
PARENT_ENV = "RADIXGEN_EXIT_WITH_PARENT"  # a replica stops when this pid is no longer its parent
LOG_TAG_ENV = "RADIXGEN_LOG_TAG"  # prefixed to a replica's log lines
MAX_RESTARTS = 5  # within RESTART_WINDOW_S; then the replica stays down
RESTART_WINDOW_S = 60.0


class Replicas:
    """The ``dp_size`` replica processes of one ``radixgen serve --dp N``."""

    def __init__(self, config: EngineConfig, settings: ServerSettings, log_level: str) -> None:
        self.config = config
        self.settings = settings
        self.log_level = log_level
        self.size = config.dp_size
        self.ports = [_free_port() for _ in range(self.size)]
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.processes: list[subprocess.Popen[bytes]] = []
        self.on_exit: Callable[[int], None] | None = None
        self._stopping = False

    def argv(self, i: int) -> list[str]:
        config = dataclasses.replace(self.config, enable_kv_events=True)  # the router reads them
        if config.hicache_dir is not None:  # a disk tier serves one process: one folder each
            config = dataclasses.replace(
                config, hicache_dir=str(Path(config.hicache_dir, f"dp{i}"))
            )
        engine = to_argv(config, skip=("dp_size",))
        spread = None if _uses_cuda(self.config) else numa.dp_nodes(self.size)
        if spread is not None and self.config.numa_node == "auto":  # the nodes in turn
            node, threads = spread[i]
            engine += ["--numa-node", str(node)]
            if not self.config.num_threads:
                engine += ["--num-threads", str(threads)]
        elif not self.config.num_threads and not _uses_cuda(self.config):
            engine += ["--num-threads", str(max(1, (os.cpu_count() or 1) // self.size))]
        server = to_argv(self.settings, skip=("host", "port", "router_policy"))
        where = ["--host", "127.0.0.1", "--port", str(self.ports[i])]
        command = [sys.executable, "-m", "radixgen", "serve", "--log-level", self.log_level]
        return command + engine + server + where

    def env(self, i: int) -> dict[str, str]:
        env = {**os.environ, PARENT_ENV: str(os.getpid()), LOG_TAG_ENV: f"[dp {i}] "}
        tp = self.config.tp_size
        if _uses_cuda(self.config) and _cuda_devices() >= self.size * tp:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in range(i * tp, (i + 1) * tp))
        return env

    def _launch(self, i: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen(self.argv(i), env=self.env(i))

    def start(self) -> None:
        """Start every replica and wait until each answers ``/health`` (RuntimeError naming
        the replica that exited first)."""
        self.processes = [self._launch(i) for i in range(self.size)]
        logger.info("data parallel: %d replicas starting on %s", self.size, ", ".join(self.urls))
        deadline = time.monotonic() + READY_TIMEOUT_S
        waiting = set(range(self.size))
        while waiting:
            for i in sorted(waiting):
                code = self.processes[i].poll()
                if code is not None:
                    self.stop()
                    raise RuntimeError(f"replica {i} exited with code {code} while starting")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(self.urls[i] + "/health", timeout=2).status_code == 200:
                        waiting.discard(i)
                        logger.info("replica %d ready at %s", i, self.urls[i])
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"replicas {sorted(waiting)} not ready in {READY_TIMEOUT_S:g} s")
            time.sleep(0.25)
        for i in range(self.size):
            threading.Thread(target=self._supervise, args=(i,), daemon=True).start()

    def _supervise(self, i: int) -> None:
        """Restart replica ``i`` whenever it exits (at most ``MAX_RESTARTS`` a window)."""
        restarts: deque[float] = deque()
        while True:
            process = self.processes[i]
            code = process.wait()
            if self._stopping:
                return
            logger.error("replica %d (pid %d) exited with code %s", i, process.pid, code)
            if self.on_exit is not None:
                self.on_exit(i)
            now = time.monotonic()
            restarts.append(now)
            while restarts and restarts[0] < now - RESTART_WINDOW_S:
                restarts.popleft()
            if len(restarts) > MAX_RESTARTS:
                logger.critical(
                    "replica %d failed %d times in a minute; not restarting it", i, len(restarts)
                )
                return
            time.sleep(1.0)
            if self._stopping:
                return
            logger.info("restarting replica %d on %s", i, self.urls[i])
            self.processes[i] = self._launch(i)

    def stop(self) -> None:
        """SIGTERM every replica (each shuts down gracefully), then wait for them."""
        self._stopping = True
        for p in self.processes:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.processes:
            try:
                p.wait(timeout=self.settings.shutdown_timeout + 15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def serve_replicas(config: EngineConfig, settings: ServerSettings, log_level: str = "info") -> None:
    """``radixgen serve --dp N``: the replicas, then the router in front of them until a
    signal."""
    replicas = Replicas(config, settings, log_level)
    replicas.start()
    from .prompt_keys import PromptKeys

    keys = PromptKeys.for_model(config.model, config.reasoning_parser, config.tool_call_parser)
    auth = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else None
    router = Router(replicas.urls, settings.router_policy, prompt_keys=keys, worker_headers=auth)

    def exited(i: int) -> None:
        router.mark(router.workers[i], False, "its process exited")

    replicas.on_exit = exited
    try:
        _run(router, settings.host, settings.port, log_level)
    finally:
        replicas.stop()


def serve_router(settings: RouterSettings, log_level: str = "info") -> None:
    """``radixgen router``: route to ``settings.worker_urls`` until a signal."""
    if not settings.worker_urls:
        raise ValueError("--worker-urls: expected at least one radixgen serve URL")
    options: dict[str, Any] = settings.policy_options()
    router = Router(
        list(settings.worker_urls),
        settings.policy,
        health_interval=settings.health_interval,
        healthy=False,  # until their first probe
        **options,
    )
    logger.info(
        "routing (%s) to %s on %s:%d",
        settings.policy,
        ", ".join(settings.worker_urls),
        settings.host,
        settings.port,
    )
    _run(router, settings.host, settings.port, log_level)


class _Server(uvicorn.Server):
    """uvicorn without re-raising the signal it stopped on, so the caller's cleanup runs."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in HANDLED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _run(router: Router, host: str, port: int, log_level: str) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health probe
    config = uvicorn.Config(create_router_app(router), host=host, port=port, log_level=log_level)
    _Server(config).run()


def exit_with_parent() -> None:
    """In a replica: SIGTERM this process once the router that started it is gone."""
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    pid = int(parent)

    def watch() -> None:
        while os.getppid() == pid:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="radixgen-parent-watch", daemon=True).start()


def _uses_cuda(config: EngineConfig) -> bool:
    if config.device.startswith("cuda"):
        return True
    if config.device != "auto":
        return False
    import torch

    return bool(torch.cuda.is_available())


def _cuda_devices() -> int:
    import torch

    return int(torch.cuda.device_count())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
