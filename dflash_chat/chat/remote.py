"""An OpenAI-compatible server as a backend: `dflash-chat --endpoint URL` (our `serve`, vLLM, SGLang,
llama.cpp's server).

Answers stream from POST /v1/chat/completions. Thinking is switched with
`chat_template_kwargs.enable_thinking` (as vLLM and SGLang take it; llama.cpp reads it too) and comes
back as `reasoning_content` (or vLLM's newer `reasoning`, or `<think>` tags in the text). Time to first
token and tokens/s are measured here, on the client. The draft figures are what the server reports,
first found of: per-request `metrics.speculative_decoding` (ours, vLLM's), llama.cpp's `timings`, or
the growth of vLLM's Prometheus counters on /metrics around the answer (chat/openai_protocol.py); the
panel says which, or that the server reports none. No engine and no torch here.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from dflash_chat.chat import openai_protocol
from dflash_chat.chat.backend import AnswerChunk, AnswerEnded, AnswerRequest, Backend, ModelLoaded, ModelUnavailable
from dflash_chat.chat.bridge import POST_INTERVAL_S, StreamChunk, StreamEnd
from dflash_chat.chat.live_stats import LiveStats
from dflash_chat.chat.prompt import ThinkingSplitter
from dflash_chat.engine.events import GenerationStats
from dflash_chat.errors import UserError

API_KEY_ENV = "DFLASH_CHAT_API_KEY"


def key_env(name: str) -> str:
    """The variable holding the key of the named endpoint `name`: big-box -> DFLASH_CHAT_API_KEY_BIG_BOX.
    Keys stay out of config.toml; each named server can have its own."""
    return f"{API_KEY_ENV}_{re.sub(r'[^A-Z0-9]', '_', name.upper())}"


def api_key(given: str | None, name: str, environ: Mapping[str, str]) -> str | None:
    """--api-key, else the named endpoint's own variable, else DFLASH_CHAT_API_KEY."""
    return given or (environ.get(key_env(name)) if name else None) or environ.get(API_KEY_ENV) or None


CONNECT_S = 5.0  # to open the connection
MODELS_S = 10.0  # for GET /v1/models (and /metrics) to answer
STALL_S = 120.0  # with no byte at all during an answer (a long prefill on a busy server takes a while)
MAX_ERROR_BODY = 64 * 1024  # of a refusal's body, read to quote its message
MAX_WHOLE_BODY = 16 * 1024 * 1024  # of a reply that is one JSON object instead of a stream


def httpx_module():
    try:  # huggingface_hub >= 2.4 brings httpx2, earlier versions httpx
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
        import httpx
    return httpx


@dataclass(frozen=True)
class Endpoint:
    """Where the server is: `base` ends in /v1; `root` is the server's own (/metrics, /health)."""

    base: str
    api_key: str | None = None
    name: str = ""  # a named endpoint from the settings, if it is one

    @classmethod
    def of(cls, url: str, api_key: str | None = None, name: str = "") -> Endpoint:
        url = url.strip()
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise UserError(
                f"--endpoint {url!r} is not an http(s) URL: give one like http://127.0.0.1:8000/v1, "
                "or the name of an endpoint in the settings (dflash-chat models lists them)"
            )
        base = url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return cls(base, api_key or None, name)

    @property
    def root(self) -> str:
        return self.base.removesuffix("/v1")

    @property
    def host(self) -> str:
        return urlsplit(self.base).netloc

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(frozen=True)
class ServedModel:
    """The model a server answers with, and whether its /metrics has vLLM's draft counters."""

    id: str
    owner: str
    counters: bool


class ServerError(Exception):
    """The server answered with an error, or not as an OpenAI server does: one plain sentence."""


def error_text(status: int, body: bytes, endpoint: Endpoint) -> str:
    """What a refused request means, in one line that says what to do."""
    message = _server_message(body)
    if status == 401:
        where = f"{key_env(endpoint.name)} or {API_KEY_ENV}" if endpoint.name else API_KEY_ENV
        return f"{endpoint.host} refused the API key ({message or 'unauthorised'}): pass --api-key KEY, or set {where}"
    return f"HTTP {status} from the server at {endpoint.host}" + (f": {message}" if message else "")


def _server_message(body: bytes) -> str:
    """The message in an OpenAI-shaped error body, else the body's text in one short line ('' for a page)."""
    try:
        error = json.loads(body).get("error")
        message = error.get("message") if isinstance(error, dict) else error
    except (ValueError, AttributeError, RecursionError):
        text = body.decode("utf-8", "replace").strip()
        message = "" if text[:1] == "<" else text  # an HTML error page says nothing useful in one line
    return _one_line(message) if isinstance(message, str) else ""


def _one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "…"


def _tokens(count: int) -> str:
    return f"{count} token{'s' if count != 1 else ''}"


def _read_capped(response, limit: int) -> bytes:
    parts, size = [], 0
    for part in response.iter_bytes():
        parts.append(part)
        size += len(part)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


class HttpBackend(Backend):
    remote = True

    def __init__(
        self, endpoint: Endpoint, *, connect_s: float = CONNECT_S, models_s: float = MODELS_S, stall_s: float = STALL_S
    ) -> None:
        self.request = endpoint
        self.endpoint = endpoint
        self.connect_s, self.models_s, self.stall_s = connect_s, models_s, stall_s
        self.served: ServedModel | None = None
        self._client = None
        self._closed = False
        self._running: set[threading.Event] = set()  # one per network call a worker waits on
        self._live: dict[threading.Event, object] = {}  # each streaming answer's response, by its cancel flag
        self._reports = False  # the server's answers carry their own figures: /metrics is not needed
        self._note = f"Connecting to {endpoint.host}…"
        self.subtitle = f"connecting to {endpoint.host}…"
        self.panel_note = "connecting…"

    @property
    def model(self):
        return self.served

    @property
    def note(self) -> str:
        return "" if self.served is not None else self._note

    def name(self) -> str:
        return f"{self.served.id} @ {self.endpoint.host}" if self.served else self.endpoint.host

    def ready_text(self, seconds: float) -> str:
        return f"Connected to {self.endpoint.host}: {self.served.id}"

    def rows(self) -> tuple[tuple[str, str], ...]:
        if self.served is None:
            return ()
        rows = [("model", self.served.id), ("server", self.endpoint.host)]
        if self.served.owner:
            rows.append(("runs", self.served.owner))
        return tuple(rows)

    def client(self):
        if self._client is None:
            httpx = httpx_module()
            timeout = httpx.Timeout(self.stall_s, connect=self.connect_s)
            self._client = httpx.Client(timeout=timeout, headers=self.endpoint.headers())
        return self._client

    # lifecycle

    def attach(self, post, spawn) -> None:
        super().attach(lambda event: None if self._closed else post(event), spawn)

    def begin(self, request: Endpoint) -> None:
        self.spawn(lambda: self._detached(self._connect), "model")

    def _detached(self, body) -> None:
        """Run `body` (network calls) on a daemon thread and wait for it, or for `close`: the worker that
        waits here is what the app joins when it quits, and quitting must never wait on the network."""
        if self._closed:
            return
        done = threading.Event()
        self._running.add(done)

        def run() -> None:
            try:
                body()
            finally:
                done.set()

        threading.Thread(target=run, name="dflash-remote", daemon=True).start()
        done.wait()
        self._running.discard(done)

    def close(self) -> None:
        """The app quits: nothing more is posted, every waiting worker returns now, open answers are cut."""
        self._closed = True
        for done in list(self._running):
            done.set()
        for response in list(self._live.values()):
            _cut(response)

    def handle(self, event: object) -> bool:
        if isinstance(event, ModelLoaded):
            if event.source is not self.endpoint:
                return False
            self.served = event.model
            self.subtitle, self.panel_note = self.name(), ""
        elif isinstance(event, ModelUnavailable):
            if event.request is not self.endpoint:
                return False
            self._note = f"No model yet: {event.error}"
            self.subtitle, self.panel_note = "no model", "not connected"
        return True

    def _connect(self) -> None:
        started = time.perf_counter()
        try:
            model = self._models()
        except Exception as exc:  # noqa: BLE001 - said in words, the app carries on
            self.post(ModelUnavailable(self.endpoint, self._why(exc)))
            return
        self.post(ModelLoaded(self.endpoint, model, time.perf_counter() - started))

    def _models(self) -> ServedModel:
        response = self.client().get(f"{self.endpoint.base}/models", timeout=self._short_timeout())
        if response.status_code != 200:
            raise ServerError(error_text(response.status_code, response.content[:MAX_ERROR_BODY], self.endpoint))
        try:
            data = response.json().get("data") or []
            card = data[0] if isinstance(data, list) and data else None
        except (ValueError, AttributeError, RecursionError):
            raise ServerError(
                f"{self.endpoint.host} is not an OpenAI-compatible server (GET /v1/models did not "
                "list models): check that the URL is the server's /v1"
            ) from None
        if card is None:
            raise ServerError(
                f"{self.endpoint.host} serves no model yet (GET /v1/models is empty); is it still loading?"
            )
        if not isinstance(card, dict) or not isinstance(card.get("id"), str):
            raise ServerError(
                f"{self.endpoint.host} lists models without an id (GET /v1/models): is it an OpenAI-compatible server?"
            )
        owner = card.get("owned_by")
        return ServedModel(card["id"], owner if isinstance(owner, str) else "", self._counters() is not None)

    def _short_timeout(self):
        return httpx_module().Timeout(self.models_s, connect=self.connect_s)

    def _counters(self) -> dict[str, float] | None:
        """vLLM's draft counters on the server's /metrics (None: none there, or no /metrics)."""
        try:
            response = self.client().get(f"{self.endpoint.root}/metrics", timeout=self._short_timeout())
            return openai_protocol.read_counters(response.text) if response.status_code == 200 else None
        except Exception:  # noqa: BLE001 - a server without /metrics simply reports no counters
            return None

    def _why(self, exc: Exception, reader: Reader | None = None) -> str:
        """Any failure talking to the server, as one plain sentence (never a Python exception's text)."""
        if isinstance(exc, ServerError):
            return str(exc)
        httpx, host = httpx_module(), self.endpoint.host
        after = f" after {_tokens(reader.new_tokens())}" if reader is not None and reader.opened_at else ""
        if isinstance(exc, httpx.ConnectTimeout):
            return f"{host} did not accept a connection within {self.connect_s:g} s: is the server up, and is the URL right?"
        if isinstance(exc, httpx.ConnectError):
            why = re.sub(r"^\[Errno -?\d+\]\s*", "", str(exc)) or "refused"
            return f"cannot reach {self.endpoint.base} ({_one_line(why, 80)}): is the server running, and is the URL right?"
        if isinstance(exc, httpx.TimeoutException):
            if reader is None:
                return f"{host} did not answer GET /v1/models within {self.models_s:g} s: is it overloaded or stuck?"
            return f"{host} sent nothing for {self.stall_s:g} s{after}: the server may be overloaded or stuck"
        if isinstance(exc, httpx.TransportError):
            return f"the connection to {host} was lost{after or ' before it answered'}"
        if isinstance(exc, httpx.InvalidURL):
            return f"{self.endpoint.base} is not a URL that can be reached: check --endpoint"
        return f"an unexpected problem talking to {host}{after}; the answer so far is kept"

    # answers

    def answer(self, request: AnswerRequest) -> None:
        served = self.served
        self.spawn(lambda: self._detached(lambda: self._answer(served, request)), "generate")

    def _body(self, served: ServedModel, request: AnswerRequest) -> dict:
        body = {
            "model": served.id,
            "messages": request.turns,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "temperature": request.temperature,
            "top_p": request.top_p,
            "max_tokens": request.max_new_tokens,
            "chat_template_kwargs": {"enable_thinking": request.thinking},
        }
        if request.top_k > 0:
            body["top_k"] = request.top_k
        return body

    def stop(self, request: AnswerRequest) -> None:
        """Cancel, and cut the connection at once: a read blocked waiting for the server returns, and
        the server sees the client leave (and stops its engine) without waiting for its next chunk."""
        request.cancel.set()
        response = self._live.get(request.cancel)
        if response is not None:
            _cut(response)

    def _answer(self, served: ServedModel, request: AnswerRequest) -> None:
        before = self._counters() if served.counters and not self._reports else None
        reader = Reader(request, self.post, lambda response: self._live.__setitem__(request.cancel, response))
        try:
            end = reader.read(self.client(), self.endpoint, self._body(served, request))
        except Exception as exc:  # noqa: BLE001 - a failed answer must not take the app down
            end = reader.cut_short() if request.cancel.is_set() else reader.broken(self._why(exc, reader))
        finally:
            self._live.pop(request.cancel, None)
        self._reports = self._reports or end.acceptance_source is not None
        if end.stats is not None and end.acceptance_source is None and before is not None:
            after = self._counters()
            acceptance = openai_protocol.from_counters(before, after) if after is not None else None
            if acceptance is not None:
                end = _with_acceptance(end, acceptance)
        self.post(AnswerEnded(end, None, served, request.chat))


def _cut(response) -> None:
    """Shut the response's socket: a read blocked on it returns at once."""
    stream = response.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed


class Reader:
    """One streamed answer: SSE lines in, batched AnswerChunks out, the figures at the end."""

    def __init__(self, request: AnswerRequest, post, opened=lambda response: None) -> None:
        self.request = request
        self.post = post
        self.opened = opened  # told the live response (HttpBackend.stop cuts it)
        self.splitter = ThinkingSplitter(thinking=False)  # <think> tags from a server without a reasoning parser
        self.thinking: list[str] = []
        self.answer: list[str] = []
        self.pending = ["", ""]
        self.live = LiveStats()
        self.deltas = 0
        self.first: float | None = None
        self.last = 0.0
        self.finish = None
        self.usage: dict = {}
        self.acceptance = None
        self.error: str | None = None
        self.host = ""
        self.started = time.monotonic()
        self.opened_at: float | None = None  # when the server accepted the request (a stream began)

    def read(self, client, endpoint: Endpoint, body: dict) -> StreamEnd:
        self.host = endpoint.host
        self.started = time.monotonic()
        with client.stream("POST", f"{endpoint.base}/chat/completions", json=body) as response:
            self.opened(response)
            if response.status_code != 200:
                raise ServerError(error_text(response.status_code, _read_capped(response, MAX_ERROR_BODY), endpoint))
            self.opened_at = time.monotonic()
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind == "application/json":  # a server that ignored "stream": one whole completion
                return self._whole(_read_capped(response, MAX_WHOLE_BODY))
            if kind != "text/event-stream":
                raise ServerError(
                    f"{endpoint.host} did not answer with an OpenAI stream (it sent "
                    f"{_one_line(kind, 40) or 'no content type'}): check that the URL is the server's /v1"
                )
            done = self._stream(response.iter_lines())
        if self.request.cancel.is_set() and not done and self.finish is None:
            return self.end("cancelled")
        if self.error:
            return self.end("error" if not self.has_text() else "cut")
        if not done and self.finish is None:
            self.error = (
                f"the stream from {endpoint.host} ended without a finish ([DONE] or finish_reason) "
                f"after {_tokens(self.new_tokens())}"
            )
            return self.end("cut" if self.has_text() else "error")
        return self.end({"length": "length"}.get(self.finish, "stop"))

    def _stream(self, lines) -> bool:
        """Read SSE lines until [DONE] (True), the end of the stream or Esc (False)."""
        posted = self.started
        for line in lines if not self.request.cancel.is_set() else ():
            if self.request.cancel.is_set():
                break  # leaving the stream closes it: the server cancels the answer
            if not line.startswith("data:"):
                continue  # comments, event names, keep-alives
            data = line[5:].strip()
            if data == "[DONE]":
                return True
            first = self.first is None
            self.take(self._chunk(data), time.monotonic())
            now = time.monotonic()
            if any(self.pending) and (first and self.first is not None or now - posted >= POST_INTERVAL_S):
                self.send()
                posted = now
        return False

    def _chunk(self, data: str) -> dict:
        try:
            chunk = json.loads(data)
        except (ValueError, RecursionError):
            chunk = None
        if not isinstance(chunk, dict):
            raise ServerError(
                f"{self.host} sent something that is not an OpenAI stream chunk after {_tokens(self.new_tokens())}"
            )
        return chunk

    def _whole(self, raw: bytes) -> StreamEnd:
        try:
            body = json.loads(raw)
            message = body["choices"][0]["message"]
        except (ValueError, RecursionError, LookupError, TypeError):
            raise ServerError(
                f"{self.host} did not answer with an OpenAI completion: check that the URL is the server's /v1"
            ) from None
        chunk = {**body, "choices": [{**body["choices"][0], "delta": message}]}
        self.take(chunk if isinstance(message, dict) else {}, time.monotonic())
        return self.end({"length": "length"}.get(self.finish, "stop") if self.finish else "cut")

    def cut_short(self) -> StreamEnd:
        """The answer as far as it came, when Esc cut the connection mid-read."""
        return self.end("cancelled")

    def broken(self, why: str) -> StreamEnd:
        """The answer as far as it came, when the connection or the protocol failed: cut, with why."""
        self.error = why
        return self.end("cut" if self.has_text() else "error")

    def has_text(self) -> bool:
        return bool(self.thinking or self.answer)

    def end(self, reason: str) -> StreamEnd:
        self._feed(*self.splitter.flush())
        if any(self.pending):
            self.send()
        stats = self.stats(time.monotonic())
        source = self.acceptance.source if self.acceptance is not None else None
        return StreamEnd(
            reason, "".join(self.thinking), "".join(self.answer), stats, self.error, acceptance_source=source
        )

    def take(self, chunk: dict, now: float) -> None:
        if "error" in chunk and not chunk.get("choices"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            message = _one_line(message) if isinstance(message, str) and message.strip() else "no reason given"
            self.error = f"the server failed after {_tokens(self.new_tokens())}: {message}"
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = {k: v for k, v in usage.items() if _count(v) is not None or k == "prompt_tokens_details"}
        found = openai_protocol.from_metrics(chunk) or openai_protocol.from_timings(chunk)
        if found is not None:
            self.acceptance = found
        timings = chunk.get("timings")
        if isinstance(timings, dict) and _count(timings.get("cache_n")) is not None:
            self.usage.setdefault("cached_n", timings["cache_n"])
        choices = chunk.get("choices")
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            delta = delta if isinstance(delta, dict) else {}
            reasoning = _text(delta.get("reasoning_content")) or _text(delta.get("reasoning"))
            content = _text(delta.get("content"))
            if reasoning or content:
                self.deltas += 1
                if self.first is None:
                    self.first = now
                self.last = now
                self._feed(reasoning, "")
                self._feed(*self.splitter.feed(content))
            if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
                self.finish = choice["finish_reason"]

    def _feed(self, thinking: str, answer: str) -> None:
        if thinking:
            self.thinking.append(thinking)
            self.pending[0] += thinking
        if answer:
            self.answer.append(answer)
            self.pending[1] += answer

    def new_tokens(self) -> int:
        count = self.usage.get("completion_tokens")
        return count if isinstance(count, int) else self.deltas

    def send(self) -> None:
        live = self.live
        live.new_tokens = self.new_tokens()
        live.prompt_tokens = self.usage.get("prompt_tokens") or 0
        if self.first is not None:
            live.ttft_s = self.first - self.started
            live.decode_s = self.last - self.first
        self.post(AnswerChunk(StreamChunk(self.pending[0], self.pending[1], live.snapshot())))
        self.pending = ["", ""]

    def stats(self, now: float) -> GenerationStats:
        details = self.usage.get("prompt_tokens_details") or {}
        reused = details.get("cached_tokens") if isinstance(details, dict) else None
        if not isinstance(reused, int):
            reused = self.usage.get("cached_n") if isinstance(self.usage.get("cached_n"), int) else 0
        stats = GenerationStats(
            prompt_tokens=self.usage.get("prompt_tokens") or 0,
            reused_tokens=reused,
            new_tokens=self.new_tokens(),
            ttft_s=(self.first - self.started) if self.first is not None else now - self.started,
            decode_s=(self.last - self.first) if self.first is not None else 0.0,
            draft="",  # not known here; the server may say it with its figures
        )
        return _stats_with(stats, self.acceptance)


def _count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _stats_with(stats: GenerationStats, acceptance) -> GenerationStats:
    if acceptance is not None:
        stats.steps, stats.drafted, stats.accepted = acceptance.steps, acceptance.drafted, acceptance.accepted
        stats.acceptance_histogram = list(acceptance.histogram)
        stats.draft = acceptance.draft
        stats.speculative = True
    return stats


def _with_acceptance(end: StreamEnd, acceptance) -> StreamEnd:
    from dataclasses import replace

    return replace(end, stats=_stats_with(end.stats, acceptance), acceptance_source=acceptance.source)
