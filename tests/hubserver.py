"""A tiny Hugging Face Hub on 127.0.0.1 for download tests, served the way the Hub serves files.

What huggingface_hub 2.4 asks of it (read from its source):
- GET /api/models/{repo}/revision/{rev}?blobs=true -> JSON {id, sha, siblings: [{rfilename,
  size, blobId, lfs: {sha256, size, pointerSize}}]} (HfApi.model_info with files_metadata).
- HEAD/GET /{repo}/resolve/{rev}/{file}: small files answer 200 with ETag = git blob id,
  X-Repo-Commit and Content-Length; LFS files answer 302 to a CDN on another origin
  (http://localhost:PORT/cdn/<sha256>) with X-Linked-Etag = sha256, X-Linked-Size and
  X-Repo-Commit, as the Hub does. Errors carry X-Error-Code (RepoNotFound, RevisionNotFound,
  EntryNotFound) which hf_raise_for_status turns into its typed errors.
- Range requests answer 206 with Content-Range. No Xet headers are ever sent.
- Gated repos (`Repo(gated="manual")`), as the Hub answers them: the listing stays public and says
  `"gated": "manual"`; a file (or GET /api/models/{repo}/auth-check) without a token answers 401,
  with a token whose account has no access 403, both with X-Error-Code: GatedRepo (which
  hf_raise_for_status turns into GatedRepoError). `Repo.granted` holds the tokens with access.
- GET /api/whoami-v2 with `Authorization: Bearer <token>` answers the account for a token in
  `HubServer.tokens` (token -> user name), else 401 "Invalid credentials in Authorization header".

Knobs for failure cases: `drop_after[filename] = n` makes the next GET of that file send n
bytes and close the connection; `delay` sleeps between 64 KiB pieces; `hold` (an Event) stops
every transfer after its first piece until it is set, so a cancel always lands mid-file;
`honour_ranges = False` answers every Range request with the whole file (200), as some
proxies do; `busy = n` answers the next n file GETs with 503.
The server counts requests and answers 500 past `max_requests`, so no client loop can spin.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

PIECE = 64 * 1024
LFS_SUFFIXES = (".gguf", ".safetensors")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = ""
    gated: str | bool = False  # "auto" or "manual": files need a token in `granted`
    granted: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if not self.commit:
            names = "".join(sorted(self.files)).encode()
            self.commit = hashlib.sha1(names + b"commit").hexdigest()

    def is_lfs(self, name: str) -> bool:
        return name.endswith(LFS_SUFFIXES)

    def sibling(self, name: str) -> dict:
        data = self.files[name]
        entry = {"rfilename": name, "size": len(data), "blobId": git_blob_id(data)}
        if self.is_lfs(name):
            entry["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names lower-cased


@dataclass
class HubServer:
    repos: dict[str, Repo]
    delay: float = 0.0
    hold: threading.Event | None = None  # unset: each transfer waits after its first piece
    honour_ranges: bool = True
    busy: int = 0  # answer this many file GETs with 503 first
    max_requests: int = 200
    drop_after: dict[str, int] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    tokens: dict[str, str] = field(default_factory=dict)  # valid token -> user name

    def __enter__(self) -> "HubServer":
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = _Server(("127.0.0.1", 0), handler)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.hold is not None:
            self.hold.set()  # no handler thread is left waiting
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def release_when(self, event: threading.Event) -> None:
        """Let held transfers go on once `event` is set (a client's cancel): the client then reads its
        next piece, sees the cancel and keeps the first piece, however fast or slow the machine is."""
        threading.Thread(target=lambda: (event.wait(120), self.hold.set()), daemon=True).start()

    def gets(self, fragment: str) -> list[Request]:
        return [r for r in self.requests if r.method == "GET" and fragment in r.path]

    def blob(self, sha256: str) -> bytes | None:
        for repo in self.repos.values():
            for data in repo.files.values():
                if hashlib.sha256(data).hexdigest() == sha256:
                    return data
        return None


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # a client that hangs up mid-file (a cancel) is a case under test, not a server fault
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_AUTH_CHECK = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/auth-check$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    hub: HubServer

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, body: bool) -> None:
        hub = self.hub
        hub.requests.append(Request(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
        if len(hub.requests) > hub.max_requests:
            return self._error(500, "TooManyRequests", "request budget of the test server spent")
        path = unquote(urlparse(self.path).path)
        if hub.busy and body and not path.startswith("/api/"):
            hub.busy -= 1
            return self._error(503, "ServiceUnavailable", "try again")
        if m := _API.match(path):
            return self._model_info(m["repo"], m["rev"])
        if path == "/api/whoami-v2":
            return self._whoami()
        if m := _AUTH_CHECK.match(path):
            repo = self._repo(m["repo"], "main")
            if repo is not None and self._may_read(m["repo"], repo):
                self._send_json({"ok": True})
            return None
        if m := _RESOLVE.match(path):
            return self._resolve(m["repo"], m["rev"], m["file"], body)
        if m := _CDN.match(path):
            data = hub.blob(m["sha"])
            if data is None:
                return self._error(404, "EntryNotFound", "no such blob")
            return self._send_file(data, {"ETag": f'"{m["sha"]}"'}, body, m["sha"])
        self._error(404, "NotFound", f"no route for {path}")

    def _repo(self, repo_id: str, rev: str) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}")
            return None
        if rev not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return repo

    def _token(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            return None
        return auth.removeprefix("Bearer ").strip() or None

    def _may_read(self, repo_id: str, repo: Repo) -> bool:
        """True for an open repo or a granted token; otherwise answers as the Hub does and False."""
        if not repo.gated:
            return True
        token = self._token()
        if token in repo.granted:
            return True
        if token is None:
            message = (
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in."
            )
            self._error(401, "GatedRepo", message)
        else:
            message = (
                f"Access to model {repo_id} is restricted and you are not in the authorized list. "
                f"Visit https://huggingface.co/{repo_id} to ask for access."
            )
            self._error(403, "GatedRepo", message)
        return False

    def _whoami(self) -> None:
        name = self.hub.tokens.get(self._token() or "")
        if name is None:
            self.send_response(401)
            self.send_header("X-Error-Message", "Invalid credentials in Authorization header")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self._send_json(
            {"type": "user", "name": name, "auth": {"accessToken": {"displayName": f"{name}-read", "role": "read"}}}
        )

    def _send_json(self, data) -> None:
        payload = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def _model_info(self, repo_id: str, rev: str) -> None:
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        self._send_json(
            {
                "id": repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": repo.gated,
                "siblings": [repo.sibling(name) for name in sorted(repo.files)],
            }
        )

    def _resolve(self, repo_id: str, rev: str, name: str, body: bool) -> None:
        repo = self._repo(repo_id, rev)
        if repo is None:
            return
        if name not in repo.files:
            return self._error(404, "EntryNotFound", f"{name} does not exist", {"X-Repo-Commit": repo.commit})
        if not self._may_read(repo_id, repo):
            return None
        data = repo.files[name]
        if repo.is_lfs(name):
            sha = hashlib.sha256(data).hexdigest()
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.hub.port}/cdn/{sha}")
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{sha}"')
            self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("ETag", f'"{git_blob_id(data)}"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        headers = {"ETag": f'"{git_blob_id(data)}"', "X-Repo-Commit": repo.commit}
        self._send_file(data, headers, body, name)

    def _send_file(self, data: bytes, headers: dict[str, str], body: bool, key: str) -> None:
        start = 0
        status = 200
        wanted = self.headers.get("Range") if self.hub.honour_ranges else None
        if wanted and (m := re.match(r"bytes=(\d+)-$", wanted)):
            start = int(m[1])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
        piece = data[start:]
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(piece)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        drop = self._take_drop(key)
        sent = 0
        for i in range(0, len(piece), PIECE):
            chunk = piece[i : i + PIECE]
            if drop is not None and sent + len(chunk) > drop:
                self.wfile.write(chunk[: drop - sent])
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(2)  # end mid-body: the client sees a broken transfer
                return
            self.wfile.write(chunk)
            sent += len(chunk)
            if i == 0 and self.hub.hold is not None:
                self.wfile.flush()
                self.hub.hold.wait(120)
            if self.hub.delay:
                self.wfile.flush()
                time.sleep(self.hub.delay)

    def _take_drop(self, key: str) -> int | None:
        for name in list(self.hub.drop_after):
            if key == name or self._sha_of(name) == key:
                return self.hub.drop_after.pop(name)
        return None

    def _sha_of(self, name: str) -> str | None:
        for repo in self.hub.repos.values():
            if name in repo.files:
                return hashlib.sha256(repo.files[name]).hexdigest()
        return None

    def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
        payload = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)


def isolate_hub(monkeypatch, tmp_path):
    """Point huggingface_hub at a private cache under tmp_path: Xet off, online, no token.

    huggingface_hub reads its settings into `constants` at import, so those are patched too.
    Returns the cache folder (HF_HOME/hub).
    """
    from huggingface_hub import constants

    home = tmp_path / "hf-home"
    monkeypatch.setenv("HF_HOME", str(home))
    for name in ("HF_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    return home / "hub"


def point_login_at(monkeypatch, server: HubServer) -> None:
    """huggingface_hub's login checks a token with its module-level HfApi, whose endpoint was fixed
    at import: point it at the test Hub (as HF_ENDPOINT set before start-up does for real)."""
    from huggingface_hub import hf_api

    monkeypatch.setattr(hf_api.api, "endpoint", server.url)
