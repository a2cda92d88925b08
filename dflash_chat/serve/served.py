"""What the server serves: the model once it is loaded, its name, the queue, the rules; and the engine
thread's side of one answer.

A request is checked here (auth, model, token ids, context) and answered on the engine thread through the
same answering service as the chat app (runtime/answering.py); its chunks go back to the event loop through
`emit` (serve/exchange.py).
"""

from __future__ import annotations

import asyncio
import copy
import hmac
import threading
import time
from dataclasses import dataclass, replace

from fastapi import Request

from dflash_chat.errors import UserError, one_line
from dflash_chat.runtime.answering import AnsweringService
from dflash_chat.runtime.bridge import StreamEnd
from dflash_chat.runtime.constraint import GrammarError
from dflash_chat.runtime.prompt import Prompt, TemplateRefused, Turn, continuing_prompt, encode
from dflash_chat.runtime.session import EngineSession
from dflash_chat.serve import MAX_BODY, images
from dflash_chat.serve.errors import SERVER_FAULT, ApiError, bad_request, log
from dflash_chat.serve.metrics import Metrics
from dflash_chat.serve.openai_chat import finish_reason
from dflash_chat.serve.requests import ChatRequest, CompletionRequest
from dflash_chat.serve.response_store import ResponseStore
from dflash_chat.serve.scheduler import Job, Scheduler
from dflash_chat.settings import Settings

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
        max_answer: int | None = None,
        allow_image_urls: bool = False,
    ) -> None:
        """`max_answer`: the most tokens one answer may have, whatever a request asks (None: the context's room);
        `allow_image_urls`: images named by http(s) URLs are fetched (else only data URLs are read)."""
        if api_key is not None and not api_key.strip():
            raise ValueError("an empty API key")  # the command refuses it in words first
        self.name = name  # None until the model manager's choice is loaded
        self.settings = settings  # the sampling defaults
        self.api_key = api_key
        self.max_body = max_body
        self.max_answer = max_answer
        self.allow_image_urls = allow_image_urls
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
        self.responses = ResponseStore()  # what previous_response_id continues
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

    def remember(self, response_id: str, turns: list[Turn]) -> None:
        """A response a later request may continue (Responses' previous_response_id): serve/response_store.py."""
        self.responses.remember(response_id, turns)

    def recall(self, response_id: str) -> list[Turn] | None:
        return self.responses.recall(response_id)

    def _queue_changed(self, running: int, waiting: int) -> None:
        if self.metrics is not None:
            self.metrics.queue(running, waiting)

    def close(self) -> None:
        self.drain()
        self.scheduler.close()

    def opened(self, loop: asyncio.AbstractEventLoop, items: asyncio.Queue) -> None:
        """An answer is being sent through `items` (on `loop`): a shutdown ends it (`drain`)."""
        self._open.add((loop, items))
        if self.draining:
            items.put_nowait(DRAIN)

    def closed(self, items: asyncio.Queue) -> None:
        """The answer sent through `items` is over (on the running loop)."""
        self._open.discard((asyncio.get_running_loop(), items))

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
        """The key, as `Authorization: Bearer KEY` (OpenAI's clients, and Anthropic's with an auth token) or
        `x-api-key: KEY` (Anthropic's with an API key)."""
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        given = token.strip() if scheme.lower() == "bearer" else request.headers.get("x-api-key", "").strip()
        if not hmac.compare_digest(given.encode(), self.api_key.encode()):
            raise ApiError(
                401,
                "Missing or wrong API key: send the header 'Authorization: Bearer KEY' (or 'x-api-key: KEY').",
                code="invalid_api_key",
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

    def shown(self, request: ChatRequest | CompletionRequest) -> ChatRequest | CompletionRequest:
        """The request with its images decoded (fetched where URLs are allowed) for the prompt; a model loaded without
        a vision tower, or an image that cannot be shown, is a 400 that says what to do (serve/images.py). Off the
        event loop: decoding a large image takes a while."""
        if not isinstance(request, ChatRequest) or not images.sources(request.turns):
            return request
        session = self.session
        assert session is not None, "check_model comes first"
        if session.vision is None:
            raise bad_request(self._no_vision(), images.sources(request.turns)[0].where, "images_not_supported")
        return replace(request, turns=images.shown(request.turns, self.allow_image_urls))

    def _no_vision(self) -> str:
        why = (
            "the vision setting is off: restart serve with --vision auto"
            if self.settings.vision == "off"
            else "serve a model with one (a catalog model fetches its tower; a GGUF target takes its mmproj-*.gguf "
            "with --mmproj FILE), or give the GPU room for it (see dflash-chat models)"
        )
        return f"This model was loaded without a vision tower, so it reads no images: {why}."

    def prompt(self, request: ChatRequest | CompletionRequest) -> Prompt:
        """The prompt as the engine gets it, rendered once, on a tokenizer of its own (never the engine
        thread's): a chat continues what the engine holds of the clients' chat (runtime/answering.py)."""
        if isinstance(request, CompletionRequest) and isinstance(request.prompt, list):
            return Prompt(text="", ids=list(request.prompt), thinking=False)
        assert self.service is not None
        with self._checker_lock:
            if isinstance(request, ChatRequest):
                return self._chat_prompt(request)
            text = request.prompt
            assert isinstance(text, str)  # a list of ids was returned above
            return Prompt(text=text, ids=encode(self._checker, text), thinking=False)

    def check_constraint(self, request: ChatRequest | CompletionRequest, prompt: Prompt) -> None:
        """Compile the grammar the answer will be held to (cached for the answer): one it cannot be is a 400 that
        names the part (runtime/constraint.py)."""
        if not isinstance(request, ChatRequest) or (request.tools is None and request.output is None):
            return
        assert self.service is not None
        try:
            self.service.session.constraint(prompt, request.tools, request.output)
        except GrammarError as exc:
            raise bad_request(f"{exc} (the answer could not be held to it).", "response_format") from None

    def _chat_prompt(self, request: ChatRequest) -> Prompt:
        """The chat's prompt; an error the model's template raises on the client's messages (a shape it does not
        take, an empty conversation) is the client's: a 400 that says what the template refused."""
        assert self.service is not None
        held = self.service.candidates(CLIENTS)
        try:
            return continuing_prompt(
                self._checker,
                request.turns,
                thinking=request.thinking,
                held=held,
                tool_use=request.tools,
                prefill=request.prefill,
                vision=self.service.session.vision,
            )
        except TemplateRefused as exc:
            raise bad_request(
                f"{exc}. Change the messages it names (their order, roles or content).", "messages", "invalid_messages"
            ) from None
        except UserError:
            raise  # the model has no template: the server's, not the client's
        except Exception as exc:  # noqa: BLE001 - a template raises what it likes (jinja2's, transformers')
            raise bad_request(
                f"The model's chat template cannot render these messages: {_first_line(exc)}. "
                "Change the messages it names (their order, roles or content).",
                "messages",
                "invalid_messages",
            ) from None

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

    def fit(
        self, request: ChatRequest | CompletionRequest, prompt_tokens: int
    ) -> tuple[ChatRequest | CompletionRequest, int | None]:
        """The request as it fits the model's context and the server's cap: an answer asked for longer than the
        context has room for (or than `max_answer`) is cut to that (returned as the second value, None when
        nothing was cut), as local runtimes do; a prompt that fills the context alone is a 400."""
        assert self.session is not None
        context, asked = self.session.context, request.sampling.max_new_tokens
        if prompt_tokens + 1 > context:
            raise bad_request(
                f"This model's maximum context length is {context} tokens; this request needs {prompt_tokens} "
                "tokens in the prompt, and no room is left to write. Start serve with a larger context "
                f"(dflash-chat serve --context {roomy_context(prompt_tokens)}), or use `dflash-chat launch`, which "
                "raises it for the agent, or shorten the prompt.",
                "messages" if isinstance(request, ChatRequest) else "prompt",
                "context_length_exceeded",
            )
        room = min(context - prompt_tokens, self.max_answer or context)
        if asked is not None and asked <= room or asked is None and self.max_answer is None:
            return request, None
        return replace(request, sampling=replace(request.sampling, max_new_tokens=room)), room

    # the engine thread's side

    def work(self, request: ChatRequest | CompletionRequest, prompt: Prompt, emit, job: Job, route: str) -> None:
        service = self.service
        assert service is not None and self.metrics is not None
        assert job.started_at is not None  # the scheduler stamps a job as it starts it
        session = service.session
        chat = isinstance(request, ChatRequest)
        queued_s = job.started_at - job.queued_at
        try:
            memory = service.memory(_conversation(request, chat))
            tools = request.tools if isinstance(request, ChatRequest) else None
            output = request.output if isinstance(request, ChatRequest) else None
            end = session.answer(
                prompt,
                request.sampling,
                job.cancel,
                emit,
                thinking_split=chat,
                memory=memory,
                tools=tools,
                output=output,
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
            reason = "abort" if end.reason == "cancelled" else finish_reason(end)
            self.metrics.answered(end.stats, reason, queued_s, time.monotonic() - job.queued_at, route)
            _log_answer(route, end.stats, reason)
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


def roomy_context(prompt_tokens: int) -> int:
    """A context to suggest for a prompt of `prompt_tokens`: a power of two with room for it and an answer."""
    context = 4096
    while context < prompt_tokens + 4096:
        context *= 2
    return context


def _log_answer(route: str, stats, reason: str) -> None:
    """One line per answer, at debug level: launch's log file keeps them; serve's terminal shows only problems."""
    log.debug(
        "%s: %d prompt tokens (%d reused), %d new at %.1f tok/s, %s",
        route,
        stats.prompt_tokens,
        stats.reused_tokens,
        stats.new_tokens,
        stats.decode_tokens_per_s,
        reason,
    )


def _first_line(exc: Exception) -> str:
    """What an exception says, in one line without its end's period (its type's name when it says nothing)."""
    lines = str(exc).strip().splitlines()
    return lines[0].rstrip(".") if lines else type(exc).__name__


def _conversation(request, chat: bool) -> tuple:
    """Which draft memory the `auto` draft length uses for a request. The API names no conversation (and the
    engine holds one sequence for every client), while acceptance follows mostly the kind of text, so
    clients share one memory per kind: chat with thinking off, chat with thinking on (drafters accept far
    less of it), raw completions."""
    return ("serve", "chat", request.thinking) if chat else ("serve", "completion")
