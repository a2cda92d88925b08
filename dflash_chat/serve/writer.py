"""How a dialect writes an answer back: whole, or as server-sent events, from the runtime's chunks.

serve/exchange.py runs every request the same way (queue, engine, client gone, shutdown) and asks the
request's Writer for the bytes: one per dialect (serve/openai_chat.py, anthropic.py, openai_responses.py).
A writer may keep state across a stream (which block is open, which index comes next).
"""

from __future__ import annotations

import json
from typing import Protocol

from dflash_chat.runtime.bridge import StreamChunk, StreamEnd


class Writer(Protocol):
    route: str  # the route's name in the metrics' labels

    def whole(self, end: StreamEnd) -> dict:
        """The whole answer as one JSON body."""
        ...

    def opening(self) -> list[str]:
        """The events a stream opens with."""
        ...

    def chunk(self, chunk: StreamChunk) -> list[str]:
        """The events for new text and calls."""
        ...

    def closing(self, end: StreamEnd) -> list[str]:
        """The events that end a stream whose answer finished."""
        ...

    def failure(self, message: str, kind: str, code: str | None) -> list[str]:
        """The events that end a stream whose answer failed (or that the server cut short); `kind` in OpenAI's
        words: server_error, invalid_request_error or service_unavailable."""
        ...

    def ping(self) -> list[str]:
        """What a stream sends while the engine writes nothing (a long prefill): keeps proxies from closing it."""
        ...

    def cut(self) -> None:
        """The stream ended before its closing (the client left, the server shut down, the answer failed): what
        was written is kept where the dialect keeps answers (a Responses id a later request continues)."""
        ...


def sse(body: dict | str, event: str | None = None) -> str:
    """One server-sent event: `data:` a JSON body (or a bare word such as [DONE]), named `event` when given."""
    data = body if isinstance(body, str) else json.dumps(body, ensure_ascii=False)
    return (f"event: {event}\n" if event else "") + f"data: {data}\n\n"
