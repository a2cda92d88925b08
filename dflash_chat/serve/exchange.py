"""One request's exchange, whatever its dialect: the body read within limits, the request checked and
queued, the answer written back whole or streamed by the route's Writer (serve/writer.py).

A request is read and checked on the event loop (body size and time, model, token ids, context), then
queued (serve/scheduler.py) and answered on the engine thread; its chunks come back through an asyncio
queue. A client that goes away (a closed stream, or a dropped connection while it waits for a whole
answer) cancels its answer: the engine stops at its next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import anyio
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.requests import ClientDisconnect

from dflash_chat.runtime.bridge import StreamChunk
from dflash_chat.serve.errors import SHUTTING_DOWN, ApiError
from dflash_chat.serve.requests import ChatRequest, CompletionRequest
from dflash_chat.serve.scheduler import Job, QueueFull
from dflash_chat.serve.served import BODY_TIMEOUT_S, DRAIN, Done, Failed, Served
from dflash_chat.serve.writer import Writer

PING_S = 10.0  # a stream with nothing to send for this long sends its dialect's ping


class ClientGone(Exception):
    """The client left before its body arrived whole, or while it waited for a whole answer: there is no one
    to answer."""


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
    try:
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise too_big
            parts.append(part)
    except ClientDisconnect:
        raise ClientGone from None
    return b"".join(parts)


async def answer(
    request: Request, served: Served, parsed: ChatRequest | CompletionRequest, writer_for: Callable[[int], Writer]
):
    """Check, queue and answer `parsed`; `writer_for(prompt_tokens)` writes the answer back in the route's
    dialect."""
    served.check_model(parsed.model)
    served.check_tokens(parsed)
    if served.draining:
        raise ApiError(503, SHUTTING_DOWN, type="service_unavailable", code="shutting_down")
    parsed = await anyio.to_thread.run_sync(served.shown, parsed)
    prompt = await anyio.to_thread.run_sync(served.prompt, parsed)
    prompt_tokens = len(prompt.ids)
    parsed, room = served.fit(parsed, prompt_tokens)
    await anyio.to_thread.run_sync(served.check_constraint, parsed, prompt)
    headers = {"X-Max-Tokens-Clamped": str(room)} if room is not None else {}
    writer = writer_for(prompt_tokens)
    loop = asyncio.get_running_loop()
    items: asyncio.Queue = asyncio.Queue()

    def emit(item) -> None:  # from the engine thread
        try:
            loop.call_soon_threadsafe(items.put_nowait, item)
        except RuntimeError:  # the loop is gone: the server is shutting down
            pass

    job = Job(lambda job: served.work(parsed, prompt, emit, job, writer.route))
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
    served.opened(loop, items)
    if parsed.streaming.stream:
        return StreamingResponse(
            stream(request, served, writer, items, job),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", **headers},
        )
    try:
        body = await whole(request, served, writer, items, job)
    except ClientGone:
        return Response(status_code=499)  # nobody reads it
    return JSONResponse(body, headers=headers)


async def whole(request: Request, served: Served, writer: Writer, items: asyncio.Queue, job: Job):
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
        served.closed(items)
    if result not in done:
        job.cancel.set()
        result.cancel()
        raise ClientGone  # nobody reads the answer
    item = result.result()
    if item is DRAIN:
        job.cancel.set()
        raise ApiError(503, SHUTTING_DOWN, type="service_unavailable", code="shutting_down")
    if isinstance(item, Failed):
        raise ApiError(
            item.status, item.message, type="server_error" if item.status >= 500 else "invalid_request_error"
        )
    return writer.whole(item.end)


async def _gone(request: Request) -> None:
    """Return once the client has disconnected (or its connection can no longer be read)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:  # noqa: BLE001 - a connection that cannot be read is one the client left
        return


async def stream(request: Request, served: Served, writer: Writer, items: asyncio.Queue, job: Job):
    """Server-Sent Events in the writer's dialect: its opening, the text and calls as they are written, its
    closing (or a failure), each event as the writer frames it; while the engine writes nothing for PING_S,
    the writer's ping.

    A client that leaves cancels the answer at once: a server on ASGI 2.4 tells a stream only when a write
    fails, and while the engine writes nothing (a long prefill, a paused step) none would."""
    watcher = asyncio.ensure_future(_gone(request))

    def left(done: asyncio.Future) -> None:
        if not done.cancelled():
            job.cancel.set()

    watcher.add_done_callback(left)
    finished = False
    try:
        for event in writer.opening():
            yield event
        while True:
            try:
                item = await asyncio.wait_for(items.get(), PING_S)
            except asyncio.TimeoutError:
                for event in writer.ping():
                    yield event
                continue
            if isinstance(item, StreamChunk):
                for event in writer.chunk(item):
                    yield event
                continue
            if item is DRAIN:
                job.cancel.set()
                events = writer.failure(SHUTTING_DOWN, "service_unavailable", "shutting_down")
            elif isinstance(item, Failed):
                events = writer.failure(
                    item.message, "server_error" if item.status >= 500 else "invalid_request_error", None
                )
            else:
                events, finished = writer.closing(item.end), True
            for event in events:
                yield event
            return
    finally:
        if not finished:
            writer.cut()
        watcher.cancel()
        job.cancel.set()  # the client left (or the answer is over: then it changes nothing)
        served.closed(items)
