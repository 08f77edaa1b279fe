"""Connection hygiene of ``radixgen serve`` (``radixgen/server/connection.py``): header and body
read timeouts (408), the keep-alive timeout and the connection cap (503), on raw sockets
against a live server on the tiny model with one-second limits."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from server_testlib import sse_events
from tiny_server import TinyServer, completion_body, make_tiny_model

TIMEOUT_S = 1.0  # --header-timeout, --body-timeout and --keep-alive-timeout of the test server
MAX_CONNECTIONS = 3
SLACK_S = 1.5  # what a loaded CI machine may add to a timer


@pytest.fixture(scope="module")
def server(tmp_path_factory, tokenizer):
    model = make_tiny_model(tmp_path_factory.mktemp("tiny-conn"), tokenizer)
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


def _stream(server: TinyServer, max_tokens: int) -> list:
    body = completion_body(server.model, max_tokens, stream=True)
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        return sse_events(r.iter_lines())


def test_a_long_stream_outlasts_every_timeout(server):
    started = time.monotonic()
    events = _stream(server, 300)  # ~3 s at ~100 tokens/s: longer than every 1 s timeout
    assert time.monotonic() - started > TIMEOUT_S * 2
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_connections_over_the_cap_get_503_and_probes_still_answer(server):
    with ThreadPoolExecutor(MAX_CONNECTIONS) as pool:
        streams = [pool.submit(_stream, server, 400) for _ in range(MAX_CONNECTIONS)]
        deadline = time.monotonic() + 30
        while _open_streams(server) < MAX_CONNECTIONS and time.monotonic() < deadline:
            time.sleep(0.1)
        refused = httpx.post(f"{server.url}/v1/completions", json=completion_body(server.model, 2))
        health = httpx.get(f"{server.url}/health")
        results = [s.result() for s in streams]
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "too_many_connections"
    assert refused.headers["connection"] == "close"
    assert health.status_code == 200 and health.headers["connection"] == "close"
    for events in results:  # the streams under the cap were not disturbed
        assert events[-1] == "[DONE]"
    after = httpx.post(f"{server.url}/v1/completions", json=completion_body(server.model, 2))
    assert after.status_code == 200


def _open_streams(server: TinyServer) -> int:
    text = httpx.get(f"{server.url}/metrics").text
    for line in text.splitlines():
        if line.startswith("radixgen_requests_in_flight "):
            return int(float(line.split()[-1]))
    raise AssertionError(f"no in-flight gauge in /metrics:\n{text}")
