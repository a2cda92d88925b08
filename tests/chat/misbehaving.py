"""A loopback HTTP server that misbehaves as told: each path answers with raw bytes a test writes, and
may drop the connection or stall at any point. Nothing of the app's own server is used."""

from __future__ import annotations

import json
import socket
import socketserver
import threading
from collections.abc import Callable

MODELS = json.dumps({"object": "list", "data": [{"id": "stub-model", "object": "model", "owned_by": "stub"}]})


def sse(*bodies) -> bytes:
    return b"".join(b"data: " + (b if isinstance(b, bytes) else json.dumps(b).encode()) + b"\n\n" for b in bodies)


def delta(text: str, finish: str | None = None) -> dict:
    return {
        "id": "c",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }


def head(status: int = 200, kind: str = "text/event-stream", length: int | None = None) -> bytes:
    # Connection: close always, as this server closes after each reply (a client would otherwise race the close
    # when it reuses the connection for its next request)
    extra = f"Content-Length: {length}\r\n" if length is not None else ""
    return f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\n{extra}Connection: close\r\n\r\n".encode()


def chunked_head(kind: str = "text/event-stream") -> bytes:
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n".encode()
    )


def chunk(data: bytes) -> bytes:
    """One HTTP chunk; a chunked body that stops without the last (empty) one was cut mid-way."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


LAST_CHUNK = b"0\r\n\r\n"


def whole(status: int, kind: str, body: bytes) -> bytes:
    return head(status, kind, len(body)) + body


class Reply:
    """What one path sends: `parts` in order; a part that is None stalls (until the test ends);
    after the parts the connection closes (so a stream without [DONE] simply ends)."""

    def __init__(self, *parts: bytes | None) -> None:
        self.parts = parts


class Misbehaving:
    def __init__(self) -> None:
        self.replies: dict[str, Reply | Callable[[], Reply]] = {
            "/v1/models": Reply(whole(200, "application/json", MODELS.encode())),
            "/metrics": Reply(whole(404, "text/plain", b"no")),
        }
        self.released = threading.Event()
        self.seen: list[str] = []
        self.bodies: list[bytes] = []  # each request's body, in order
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                owner._handle(self.request)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def _handle(self, sock: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            part = sock.recv(65536)
            if not part:
                return
            data += part
        header, _, body = data.partition(b"\r\n\r\n")
        lines = header.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        length = next((int(line.split(":")[1]) for line in lines if line.lower().startswith("content-length")), 0)
        while len(body) < length:
            body += sock.recv(65536)
        self.seen.append(path)
        self.bodies.append(body)
        reply = self.replies.get(path, Reply(whole(404, "text/plain", b"nothing here")))
        reply = reply() if callable(reply) else reply
        for part in reply.parts:
            if part is None:
                self.released.wait(30)
                return
            sock.sendall(part)

    def __enter__(self) -> Misbehaving:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()
