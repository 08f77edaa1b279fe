"""Connection hygiene of ``radixgen serve`` (``radixgen/server/connection.py``): header and body
read timeouts (408), the keep-alive timeout and the connection cap (503), on raw sockets
against a live server on the tiny model with one-second limits."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from tiny_server import TinyServer, completion_body

TIMEOUT_S = 1.0  # --header-timeout, --body-timeout and --keep-alive-timeout of the test server
MAX_CONNECTIONS = 3
SLACK_S = 1.5  # what a loaded CI machine may add to a timer


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_folder):
    model = tiny_model_folder
    log = tmp_path_factory.mktemp("conn-server") / "server.log"
    flags = ["--header-timeout", "1", "--body-timeout", "1", "--keep-alive-timeout", "1"]
    srv = TinyServer(model, log, *flags, "--max-connections", str(MAX_CONNECTIONS))
    yield srv
    srv.stop()


def _connect(server: TinyServer) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed it."""
    started, data = time.monotonic(), b""
    sock.settimeout(limit_s)
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            pytest.fail(f"connection still open after {limit_s} s; received {data!r}")
        if not chunk:
            return data, time.monotonic() - started
        data += chunk


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (headers and a Content-Length body) from a kept-alive connection."""
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _status_and_json(response: bytes) -> tuple[int, dict]:
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_slow_headers_get_408_and_the_connection_closes(server):
    sock = _connect(server)
    started = time.monotonic()
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
    sock.settimeout(0.25)
    data = b""
    while time.monotonic() - started < TIMEOUT_S + SLACK_S:  # slowloris: a byte now and then
        try:
            sock.sendall(b"x")
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:  # closed while we wrote
            break
        if not chunk:
            break
        data += chunk
    rest, _ = _read_until_closed(sock, SLACK_S)
    elapsed = time.monotonic() - started
    status, body = _status_and_json(data + rest)
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    assert "--header-timeout" in body["error"]["message"]
    assert TIMEOUT_S * 0.9 <= elapsed <= TIMEOUT_S + SLACK_S


def test_slow_headers_of_a_second_request_on_a_kept_alive_connection_get_408(server):
    sock = _connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert _read_response(sock).startswith(b"HTTP/1.1 200")
    sock.sendall(b"GET /health HTTP/1.1\r\n")  # and no more: the header timer starts here
    data, elapsed = _read_until_closed(sock, TIMEOUT_S + SLACK_S)
    assert _status_and_json(data)[0] == 408
    assert elapsed >= TIMEOUT_S * 0.9


def test_a_connection_that_sends_nothing_is_closed(server):
    sock = _connect(server)
    data, elapsed = _read_until_closed(sock, TIMEOUT_S + SLACK_S)
    assert data == b""
    assert elapsed >= TIMEOUT_S * 0.9


def test_stalled_body_gets_408(server):
    sock = _connect(server)
    body = json.dumps(completion_body(server.model, 4)).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    sock.sendall(head + body[:10])  # then nothing
    data, elapsed = _read_until_closed(sock, TIMEOUT_S + SLACK_S)
    status, payload = _status_and_json(data)
    assert status == 408
    assert "--body-timeout" in payload["error"]["message"]
    assert elapsed >= TIMEOUT_S * 0.9
    assert httpx.get(f"{server.url}/health").status_code == 200  # the server is fine


def test_a_slow_body_that_keeps_moving_is_read(server):
    sock = _connect(server)
    body = json.dumps(completion_body(server.model, 2)).encode()
    head = (
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    )
    sock.sendall(head)
    for i in range(0, len(body), len(body) // 4 + 1):  # 4 pieces over ~1.6 s, 0.4 s apart
        time.sleep(TIMEOUT_S * 0.4)
        sock.sendall(body[i : i + len(body) // 4 + 1])
    data, _ = _read_until_closed(sock, 30)
    status, payload = _status_and_json(data)
    assert status == 200, payload
    assert payload["choices"][0]["finish_reason"] == "length"


def test_idle_keep_alive_connection_is_closed(server):
    sock = _connect(server)
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert _read_response(sock).startswith(b"HTTP/1.1 200")
    data, elapsed = _read_until_closed(sock, TIMEOUT_S + SLACK_S)
    assert data == b""
    assert elapsed >= TIMEOUT_S * 0.8


LONG = 8000  # max_tokens of a stream that runs until the test closes it (context 8192)


@contextlib.contextmanager
def _long_stream(client: httpx.Client, model: str) -> Iterator[Iterator[str]]:
    """An open ``stream: true`` completion (its SSE lines); closing it aborts the request."""
    body = completion_body(model, LONG, stream=True)
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200
        yield (line for line in response.iter_lines() if line.startswith("data: "))


def test_a_long_stream_outlasts_every_timeout(server):
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with _long_stream(client, server.model) as lines:
            started = time.monotonic()
            while time.monotonic() - started < TIMEOUT_S * 3:  # past every 1 s timeout
                assert next(lines)  # raises if the server cut the stream


def test_connections_over_the_cap_get_503_and_probes_still_answer(server):
    with contextlib.ExitStack() as stack:
        streams = []
        for _ in range(MAX_CONNECTIONS):
            client = stack.enter_context(httpx.Client(base_url=server.url, timeout=30))
            streams.append(stack.enter_context(_long_stream(client, server.model)))
            next(streams[-1])
        refused = httpx.post(f"{server.url}/v1/completions", json=completion_body(server.model, 2))
        health = httpx.get(f"{server.url}/health")
        for lines in streams:  # the streams under the cap go on
            assert next(lines)
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "too_many_connections"
    assert refused.headers["connection"] == "close"
    assert health.status_code == 200 and health.headers["connection"] == "close"
    time.sleep(0.5)  # the streams' connections close
    after = httpx.post(f"{server.url}/v1/completions", json=completion_body(server.model, 2))
    assert after.status_code == 200
