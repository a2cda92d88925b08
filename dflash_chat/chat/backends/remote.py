"""An OpenAI-compatible server as a backend: `dflash-chat --endpoint URL` (our `serve`, vLLM, SGLang,
llama.cpp's server).

Answers stream from POST /v1/chat/completions. Thinking is switched with
`chat_template_kwargs.enable_thinking` (as vLLM and SGLang take it; llama.cpp reads it too) and comes
back as `reasoning_content` (or vLLM's newer `reasoning`, or `<think>` tags in the text). Time to first
token and tokens/s are measured here, on the client. The draft figures are what the server reports,
first found of: per-request `metrics.speculative_decoding` (ours, vLLM's), llama.cpp's `timings`, or
the growth of vLLM's Prometheus counters on /metrics around the answer (runtime/openai_protocol.py); the
panel says which, or that the server reports none. No engine and no torch here.
"""

from __future__ import annotations

import re
import socket
import threading
import time

from dflash_chat.chat.backends.base import AnswerRequest, Backend, Post, Spawn
from dflash_chat.chat.backends.remote_stream import MAX_ERROR_BODY, Reader, with_acceptance
from dflash_chat.chat.events import AnswerEnded
from dflash_chat.chat.images import openai_turns
from dflash_chat.errors import UserError
from dflash_chat.runtime import openai_protocol
from dflash_chat.runtime.endpoint import (
    Endpoint,
    ServedModel,
    ServerError,
    error_text,
    httpx_module,
    short_line,
    tokens_text,
)
from dflash_chat.runtime.events import LoadEvent, ModelLoaded, ModelUnavailable, Status

CONNECT_S = 5.0  # to open the connection
MODELS_S = 10.0  # for GET /v1/models (and /metrics) to answer
STALL_S = 120.0  # with no byte at all during an answer (a long prefill on a busy server takes a while)


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
        self._status = Status("connecting", what=endpoint.host)

    @property
    def model(self) -> ServedModel | None:
        return self.served

    @property
    def status(self) -> Status:
        return self._status

    def name(self) -> str:
        return f"{self.served.id} @ {self.endpoint.host}" if self.served else self.endpoint.host

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

    def attach(self, post: Post, spawn: Spawn) -> None:
        super().attach(lambda event: None if self._closed else post(event), spawn)

    def begin(self) -> None:
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

    def handle(self, event: LoadEvent) -> bool:
        if isinstance(event, ModelLoaded):
            if event.source is not self.endpoint:
                return False
            self.served = event.model  # type: ignore[assignment]  # a server's model
            self._status = Status("ready", what=self.endpoint.host)
        elif isinstance(event, ModelUnavailable):
            if event.request is not self.endpoint:
                return False
            self._status = Status("unavailable", what=self.endpoint.host, error=event.error)
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
        if isinstance(exc, (ServerError, UserError)):  # an image of the chat that cannot be read
            return str(exc)
        httpx, host = httpx_module(), self.endpoint.host
        after = f" after {tokens_text(reader.new_tokens())}" if reader is not None and reader.opened_at else ""
        if isinstance(exc, httpx.ConnectTimeout):
            return f"{host} did not accept a connection within {self.connect_s:g} s: is the server up, and is the URL right?"
        if isinstance(exc, httpx.ConnectError):
            why = re.sub(r"^\[Errno -?\d+\]\s*", "", str(exc)) or "refused"
            return f"cannot reach {self.endpoint.base} ({short_line(why, 80)}): is the server running, and is the URL right?"
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
        assert served is not None, "answer() before the server named its model"
        self.spawn(lambda: self._detached(lambda: self._answer(served, request)), "generate")

    def _body(self, served: ServedModel, request: AnswerRequest) -> dict:
        turns = openai_turns(request.turns, request.images) if request.images is not None else request.turns
        body = {
            "model": served.id,
            "messages": [openai_protocol.message_body(turn) for turn in turns],
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "chat_template_kwargs": {"enable_thinking": request.thinking},
            **openai_protocol.sampling_fields(request.sampling),
        }
        if request.tools is not None and request.tools.offered:
            body.update(openai_protocol.tool_fields(request.tools))
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
                end = with_acceptance(end, acceptance)
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
