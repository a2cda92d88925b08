"""The routes: /v1/chat/completions, /v1/completions, /v1/messages (and its count_tokens), /v1/models,
/health, /metrics.

Each route reads its body in its dialect (serve/openai_chat.py, serve/anthropic.py) into the one
internal request, and serve/exchange.py answers it with the route's writer. Every failure is a JSON
error in the route's dialect's shape; the server keeps serving.
"""

from __future__ import annotations

from dataclasses import replace

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from dflash_chat.errors import one_line
from dflash_chat.runtime.prompt import Turn
from dflash_chat.serve import anthropic, openai_chat, openai_responses
from dflash_chat.serve.errors import LOGGED, SERVER_FAULT, ApiError, log, log_refusal, one_line_failures
from dflash_chat.serve.exchange import ClientGone, answer, read_body
from dflash_chat.serve.guard import Guard, host_names
from dflash_chat.serve.metrics import CONTENT_TYPE
from dflash_chat.serve.requests import parse_json
from dflash_chat.serve.served import Served


def build_app(served: Served, host: str = "127.0.0.1"):
    """The API behind its Guard (Host, Origin, Content-Type); `host`: the address it is bound to."""
    hosts = host_names(host, served.allow_hosts)
    return Guard(one_line_failures(build_routes(served)), hosts=hosts, origins=served.allow_origins, shape=error_json)


def error_json(path: str, error: ApiError) -> dict:
    """An error's JSON in the dialect of the route it answers: Anthropic's under /v1/messages, else OpenAI's."""
    return anthropic.error_body(error) if path.startswith("/v1/messages") else error.body()


def build_routes(served: Served) -> FastAPI:
    app = FastAPI(title="dflash-chat", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.served = served

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        log_refusal(request.method, request.url.path, exc)
        return JSONResponse(error_json(request.url.path, exc), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: ClientGone):
        log.warning("499 %s %s: the client hung up before its request was whole", request.method, request.url.path)
        return Response(status_code=499)  # nobody reads it

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        message = {
            404: f"There is no {request.url.path} here: the API is under /v1 (see /v1/models).",
            405: f"{request.method} is not allowed on {request.url.path}.",
        }.get(exc.status_code, str(exc.detail))
        error = ApiError(exc.status_code, message, type=kind)
        return JSONResponse(error_json(request.url.path, error), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        log.error("500 %s %s: %s", request.method, request.url.path, one_line(exc, "the request"))
        request.scope[LOGGED] = True
        error = ApiError(500, SERVER_FAULT, type="server_error")
        return JSONResponse(error_json(request.url.path, error), status_code=500)

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

    async def body_of(request: Request) -> dict:
        served.check_auth(request)
        return parse_json(await read_body(request, served.max_body, served.body_timeout_s))

    async def openai(request: Request, parse, chat: bool):
        parsed = parse(await body_of(request), served.settings)
        # no name yet means no model yet: answer() refuses the request (503) before a writer is made
        kind = openai_chat.Kind.new(chat, served.name or "")

        def writer(prompt_tokens: int) -> openai_chat.ChatWriter:
            return openai_chat.ChatWriter(kind, served.spec_tokens, parsed.streaming, prompt_tokens)

        return await answer(request, served, parsed, writer)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await openai(request, openai_chat.chat_request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await openai(request, openai_chat.completion_request, chat=False)

    @app.post("/v1/messages")
    async def messages(request: Request):
        parsed = anthropic.messages_request(await body_of(request), served.settings)
        parsed = replace(parsed, model=None)  # Claude Code asks for its own model names (for side tasks too)

        def writer(prompt_tokens: int) -> anthropic.MessagesWriter:
            return anthropic.MessagesWriter(served.name or "", served.spec_tokens, prompt_tokens)

        return await answer(request, served, parsed, writer)

    @app.post("/v1/responses")
    async def responses(request: Request):
        body = await body_of(request)
        parsed = openai_responses.responses_request(body, served.settings, served.recall)

        def keep(response_id: str, answer: Turn) -> None:
            if body.get("store", True) is not False:
                served.remember(response_id, [*parsed.turns, answer])

        def writer(prompt_tokens: int) -> openai_responses.ResponsesWriter:
            return openai_responses.ResponsesWriter(body, served.name or "", served.spec_tokens, prompt_tokens, keep)

        return await answer(request, served, parsed, writer)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request):
        parsed = anthropic.messages_request(await body_of(request), served.settings, counting=True)
        served.check_model(None)
        shown = await anyio.to_thread.run_sync(served.shown, parsed)
        prompt = await anyio.to_thread.run_sync(served.prompt, shown)
        return {"input_tokens": len(prompt.ids)}

    return app
