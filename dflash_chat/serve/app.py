"""The routes: /v1/chat/completions, /v1/completions, /v1/models, /health, /metrics.

A request is read and checked here on the event loop (auth, body size, JSON, fields, model, context),
then queued (serve/scheduler.py) and answered on the engine thread; its chunks come back through an
asyncio queue. Streams are Server-Sent Events as OpenAI's are. A client that goes away (a closed
stream, or a dropped connection while it waits for a whole answer) cancels its answer: the engine
stops at its next step. Every failure is an OpenAI-shaped JSON error; the server keeps serving.
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import threading
import time
from dataclasses import dataclass

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from dflash_chat.errors import one_line
from dflash_chat.runtime.answering import AnsweringService
from dflash_chat.runtime.bridge import StreamChunk, StreamEnd
from dflash_chat.runtime.prompt import Prompt, encode, next_prompt
from dflash_chat.runtime.session import EngineSession
from dflash_chat.serve import responses
from dflash_chat.serve.errors import SERVER_FAULT, SHUTTING_DOWN, ApiError, bad_request, error_body, log, log_refusal
from dflash_chat.serve.guard import Guard, host_names
from dflash_chat.serve.metrics import CONTENT_TYPE, Metrics
from dflash_chat.serve.requests import ChatRequest, CompletionRequest, chat_request, completion_request, parse_json
from dflash_chat.serve.scheduler import Job, QueueFull, Scheduler
from dflash_chat.settings import Settings

MAX_BODY = 4 * 1024 * 1024  # bytes; a long chat is far smaller
BODY_TIMEOUT_S = 10.0  # a body must have arrived whole by then (a short one would hold the connection)
DRAIN = object()  # put in each open answer's queue when the server shuts down
CLIENTS = "clients"  # the answering service's key for what the engine holds: one for every client


@dataclass(frozen=True)
class Done:
    end: StreamEnd
    queued_s: float


@dataclass(frozen=True)
class Failed:
    message: str
    status: int = 500


class Served:
    """What the server serves: the model once it is loaded, its name, the queue, the rules."""

    def __init__(
        self,
        name: str | None,
        settings: Settings,
        *,
        api_key: str | None = None,
        max_waiting: int = 8,
        max_body: int = MAX_BODY,
        body_timeout_s: float = BODY_TIMEOUT_S,
        metrics_auth: bool = False,
        allow_origins: tuple[str, ...] = (),
        allow_hosts: tuple[str, ...] = (),
    ) -> None:
        if api_key is not None and not api_key.strip():
            raise ValueError("an empty API key")  # the command refuses it in words first
        self.name = name  # None until the model manager's choice is loaded
        self.settings = settings  # the sampling defaults
        self.api_key = api_key
        self.max_body = max_body
        self.body_timeout_s = body_timeout_s
        self.metrics_auth = metrics_auth
        self.allow_origins = allow_origins
        self.allow_hosts = allow_hosts
        self.vocab: int | None = None  # token ids a raw prompt may hold: below this
        self._open: set[tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = set()  # answers being sent
        self.draining = False
        self.service: AnsweringService | None = None  # once the model is loaded
        self.load_error: str | None = None
        self.metrics: Metrics | None = None
        self.scheduler = Scheduler(max_waiting, on_change=self._queue_changed)
        self._checker: object = None  # a tokenizer of its own for checking requests, never the engine thread's
        self._checker_lock = threading.Lock()

    def ready(self, session: EngineSession) -> None:
        """The model is loaded: answer with it, through the same answering service as the chat app."""
        self._checker = copy.deepcopy(session.tokenizer)
        self.vocab = _vocabulary(session)
        assert self.name is not None, "the served name is set before the model is ready (serve/server.py)"
        self.metrics = Metrics(self.name, session.spec_tokens)
        self.service = AnsweringService(session)

    @property
    def session(self) -> EngineSession | None:
        return self.service.session if self.service is not None else None

    @property
    def spec_tokens(self) -> int:
        """Drafts per verify step of the model served (0 before one is loaded)."""
        return self.service.session.spec_tokens if self.service is not None else 0

    def _queue_changed(self, running: int, waiting: int) -> None:
        if self.metrics is not None:
            self.metrics.queue(running, waiting)

    def close(self) -> None:
        self.drain()
        self.scheduler.close()

    def drain(self) -> int:
        """Shutting down: every answer still being sent ends now (its stream with an error event and
        [DONE]); returns how many there were. Safe from any thread."""
        self.draining = True
        cut = 0
        for loop, queue in list(self._open):
            try:
                loop.call_soon_threadsafe(queue.put_nowait, DRAIN)
                cut += 1
            except RuntimeError:  # that loop is closed already
                pass
        return cut

    # checks on the event loop's side

    def check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(
                401, "Missing or wrong API key: send the header 'Authorization: Bearer KEY'.", code="invalid_api_key"
            )

    def check_model(self, model: str | None) -> None:
        if self.session is None:
            why = f"The model failed to load: {self.load_error}" if self.load_error else "The model is still loading"
            raise ApiError(
                503,
                f"{why}; try again in a moment (GET /health says when it is ready).",
                type="service_unavailable",
                code="model_not_ready",
                headers={"Retry-After": "5"},
            )
        if model is not None and model != self.name:
            raise ApiError(
                404,
                f"The model '{model}' does not exist here; this server serves '{self.name}' (GET /v1/models).",
                param="model",
                code="model_not_found",
            )

    def prompt(self, request: ChatRequest | CompletionRequest) -> Prompt:
        """The prompt as the engine gets it, rendered once, on a tokenizer of its own (never the engine
        thread's): a chat continues what the engine holds of the clients' chat (runtime/answering.py)."""
        if isinstance(request, CompletionRequest) and isinstance(request.prompt, list):
            return Prompt(text="", ids=list(request.prompt), thinking=False)
        assert self.service is not None
        with self._checker_lock:
            if isinstance(request, ChatRequest):
                held = self.service.held(CLIENTS)
                return next_prompt(
                    self._checker, request.turns, thinking=request.thinking, previous=held, tool_use=request.tools
                )
            text = request.prompt
            assert isinstance(text, str)  # a list of ids was returned above
            return Prompt(text=text, ids=encode(self._checker, text), thinking=False)

    def check_tokens(self, request: ChatRequest | CompletionRequest) -> None:
        """Token ids the model has no row for would reach the device (on CUDA, an assert that poisons the
        context for every later request): refused here."""
        if not isinstance(request, CompletionRequest) or not isinstance(request.prompt, list) or self.vocab is None:
            return
        highest = max(request.prompt)
        if highest >= self.vocab:
            raise bad_request(
                f"'prompt' holds the token id {highest}, but this model's vocabulary has {self.vocab} "
                f"tokens (ids 0 to {self.vocab - 1}).",
                "prompt",
                "invalid_token_id",
            )

    def check_context(self, request: ChatRequest | CompletionRequest, prompt_tokens: int) -> None:
        """The one check that the prompt and the answer asked for fit in the model's context."""
        assert self.session is not None
        context, asked = self.session.context, request.sampling.max_new_tokens
        if prompt_tokens + (asked or 1) > context:
            wanted = (
                f"{prompt_tokens + asked} tokens ({prompt_tokens} in the prompt, {asked} to write)"
                if asked
                else f"{prompt_tokens} tokens in the prompt, and no room is left to write"
            )
            raise bad_request(
                f"This model's maximum context length is {context} tokens; this request needs {wanted}. "
                "Shorten the prompt or lower max_tokens.",
                "messages" if isinstance(request, ChatRequest) else "prompt",
                "context_length_exceeded",
            )

    # the engine thread's side

    def work(self, request: ChatRequest | CompletionRequest, prompt: Prompt, emit, job: Job) -> None:
        service = self.service
        assert service is not None and self.metrics is not None
        assert job.started_at is not None  # the scheduler stamps a job as it starts it
        session = service.session
        chat = isinstance(request, ChatRequest)
        queued_s = job.started_at - job.queued_at
        try:
            memory = service.memory(_conversation(request, chat))
            tools = request.tools if isinstance(request, ChatRequest) else None
            end = session.answer(
                prompt, request.sampling, job.cancel, emit, thinking_split=chat, memory=memory, tools=tools
            )
        except Exception as exc:  # noqa: BLE001 - one request fails, the server goes on
            service.keep(CLIENTS, None)
            log.error("an answer failed: %s", one_line(exc, "generation"))
            emit(Failed(SERVER_FAULT))
            return
        if isinstance(request, ChatRequest):
            service.answered(CLIENTS, request.turns, prompt, end)
        else:
            service.keep(CLIENTS, None)  # the engine now holds a raw completion: no chat to continue
        if end.stats is not None and end.reason != "error":
            reason = "abort" if end.reason == "cancelled" else responses.finish_reason(end)
            self.metrics.answered(end.stats, reason, queued_s, time.monotonic() - job.queued_at)
        if end.reason == "error":
            log.error("an answer failed: %s", end.error or "the engine gave no reason")
        emit(Done(end, queued_s) if end.reason != "error" else Failed(SERVER_FAULT))


def _vocabulary(session) -> int | None:
    """Ids both the tokenizer and the target's embedding know."""
    sizes = []
    try:
        sizes.append(len(session.tokenizer))
    except TypeError:
        pass
    size = getattr(getattr(getattr(getattr(session, "pair", None), "engine", None), "target", None), "cfg", None)
    vocab_size = getattr(size, "vocab_size", None)
    if isinstance(vocab_size, int):
        sizes.append(vocab_size)
    return min(sizes) if sizes else None


def _conversation(request, chat: bool) -> tuple:
    """Which draft memory the `auto` draft length uses for a request. The API names no conversation (and the
    engine holds one sequence for every client), while acceptance follows mostly the kind of text, so
    clients share one memory per kind: chat with thinking off, chat with thinking on (drafters accept far
    less of it), raw completions."""
    return ("serve", "chat", request.thinking) if chat else ("serve", "completion")


def build_app(served: Served, host: str = "127.0.0.1"):
    """The API behind its Guard (Host, Origin, Content-Type); `host`: the address it is bound to."""
    return Guard(build_routes(served), hosts=host_names(host, served.allow_hosts), origins=served.allow_origins)


def build_routes(served: Served) -> FastAPI:
    app = FastAPI(title="dflash-chat", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served = served

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        log_refusal(request.method, request.url.path, exc)
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        message = {
            404: f"There is no {request.url.path} here: the API is under /v1 (see /v1/models).",
            405: f"{request.method} is not allowed on {request.url.path}.",
        }.get(exc.status_code, str(exc.detail))
        return JSONResponse(error_body(message, kind), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.error("500 %s %s: %s", request.method, request.url.path, one_line(exc, "the request"))
        return JSONResponse(error_body(SERVER_FAULT, "server_error"), status_code=500)

    @app.get("/health")
    async def health():
        if served.session is None:
            state = "error" if served.load_error else "loading"
            return JSONResponse({"status": state, "error": served.load_error}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics(request: Request):
        if served.metrics_auth:
            served.check_auth(request)
        body = served.metrics.text() if served.metrics is not None else b""
        return Response(body, media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request):
        served.check_auth(request)
        if served.name is None:
            return {"object": "list", "data": []}
        card = {"id": served.name, "object": "model", "created": 0, "owned_by": "dflash-chat"}
        if served.session is not None:
            card["max_model_len"] = served.session.context
        return {"object": "list", "data": [card]}

    async def completion(request: Request, parse, chat: bool):
        served.check_auth(request)
        body = await read_body(request, served.max_body, served.body_timeout_s)
        parsed = parse(parse_json(body), served.settings)
        # no name yet means no model yet: answer() refuses the request (503) before the kind is used
        return await answer(request, served, parsed, responses.Kind.new(chat, served.name or ""))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await completion(request, chat_request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await completion(request, completion_request, chat=False)

    return app


async def read_body(request: Request, limit: int, timeout_s: float = BODY_TIMEOUT_S) -> bytes:
    """The body, refused (413) past `limit` bytes without reading the rest, and (408) when it has not
    all come within `timeout_s` (a body shorter than its Content-Length would wait forever)."""
    try:
        with anyio.fail_after(timeout_s):  # asyncio.timeout is Python 3.11's; this project runs on 3.10 too
            return await _read_body(request, limit)
    except TimeoutError:
        raise ApiError(
            408,
            f"The request body did not arrive whole within {timeout_s:g} s (is it shorter than its Content-Length?).",
            code="request_timeout",
            headers={"Connection": "close"},
        ) from None


async def _read_body(request: Request, limit: int) -> bytes:
    too_big = ApiError(
        413, f"The request body is larger than this server takes ({limit} bytes).", code="request_too_large"
    )
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_big
        parts.append(part)
    return b"".join(parts)


async def answer(request: Request, served: Served, parsed: ChatRequest | CompletionRequest, kind: responses.Kind):
    served.check_model(parsed.model)
    served.check_tokens(parsed)
    if served.draining:
        raise ApiError(503, SHUTTING_DOWN, type="service_unavailable", code="shutting_down")
    prompt = await anyio.to_thread.run_sync(served.prompt, parsed)
    prompt_tokens = len(prompt.ids)
    served.check_context(parsed, prompt_tokens)
    loop = asyncio.get_running_loop()
    items: asyncio.Queue = asyncio.Queue()

    def emit(item) -> None:  # from the engine thread
        try:
            loop.call_soon_threadsafe(items.put_nowait, item)
        except RuntimeError:  # the loop is gone: the server is shutting down
            pass

    job = Job(lambda job: served.work(parsed, prompt, emit, job))
    try:
        served.scheduler.submit(job)
    except QueueFull as full:
        raise ApiError(
            429,
            f"The server is busy: one answer runs and {served.scheduler.max_waiting} wait already. "
            f"Try again in {full.retry_after} s.",
            type="rate_limit_error",
            code="rate_limit_exceeded",
            headers={"Retry-After": str(full.retry_after)},
        ) from None
    served._open.add((loop, items))
    if served.draining:
        items.put_nowait(DRAIN)
    if parsed.streaming.stream:
        return StreamingResponse(
            stream(request, served, parsed, kind, items, job, prompt_tokens),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    return await whole(request, served, kind, items, job)


async def whole(request: Request, served: Served, kind: responses.Kind, items: asyncio.Queue, job: Job):
    """The whole answer as one response; the client leaving while it waits cancels the answer."""

    async def finished():
        while True:
            item = await items.get()
            if isinstance(item, (Done, Failed)) or item is DRAIN:
                return item

    result, watcher = asyncio.ensure_future(finished()), asyncio.ensure_future(_gone(request))
    try:
        done, _ = await asyncio.wait({result, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        served._open.discard((asyncio.get_running_loop(), items))
    if result not in done:
        job.cancel.set()
        result.cancel()
        return Response(status_code=499)  # nobody reads it
    item = result.result()
    if item is DRAIN:
        job.cancel.set()
        raise ApiError(503, SHUTTING_DOWN, type="service_unavailable", code="shutting_down")
    if isinstance(item, Failed):
        raise ApiError(
            item.status, item.message, type="server_error" if item.status >= 500 else "invalid_request_error"
        )
    return responses.completion(kind, item.end, served.spec_tokens)


async def _gone(request: Request) -> None:
    """Return once the client has disconnected (or its connection can no longer be read)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - a connection that cannot be read is one the client left
        return


async def stream(
    request: Request,
    served: Served,
    parsed,
    kind: responses.Kind,
    items: asyncio.Queue,
    job: Job,
    prompt_tokens: int,
):
    """Server-Sent Events: the role, the text as it is written, the finish, usage and figures, [DONE].

    A client that leaves cancels the answer at once: a server on ASGI 2.4 tells a stream only when a write
    fails, and while the engine writes nothing (a long prefill, a paused step) none would."""
    continuous = prompt_tokens if parsed.streaming.continuous_usage else None
    watcher = asyncio.ensure_future(_gone(request))

    def left(done: asyncio.Future) -> None:
        if not done.cancelled():
            job.cancel.set()

    watcher.add_done_callback(left)
    try:
        opening = responses.first_chunk(kind)
        if opening is not None:
            yield responses.sse(opening)
        calls = 0  # tool calls sent so far: the next one's index
        while True:
            item = await items.get()
            if isinstance(item, StreamChunk):
                if item.thinking or item.answer or item.tool_calls:
                    yield responses.sse(responses.text_chunk(kind, item, continuous, calls))
                    calls += len(item.tool_calls)
                continue
            if item is DRAIN:
                job.cancel.set()
                yield responses.sse(error_body(SHUTTING_DOWN, "service_unavailable", None, "shutting_down"))
            elif isinstance(item, Failed):
                yield responses.sse(
                    error_body(item.message, "server_error" if item.status >= 500 else "invalid_request_error")
                )
            else:
                for body in responses.last_chunks(kind, item.end, served.spec_tokens, parsed.streaming.include_usage):
                    yield responses.sse(body)
            yield responses.sse("[DONE]")
            return
    finally:
        watcher.cancel()
        job.cancel.set()  # the client left (or the answer is over: then it changes nothing)
        served._open.discard((asyncio.get_running_loop(), items))
