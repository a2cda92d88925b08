"""One streamed answer from an OpenAI-compatible server: SSE lines in, batched chunks out, the figures
at the end (a whole JSON completion too, from a server that ignored "stream"). The answer's tool calls,
streamed in pieces (`delta.tool_calls`), come whole in the last chunk and in StreamEnd.tool_calls.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace

from dflash_chat.chat.backends.base import AnswerRequest
from dflash_chat.engine.events import GenerationStats
from dflash_chat.runtime import openai_protocol
from dflash_chat.runtime.bridge import POST_INTERVAL_S, StreamChunk, StreamEnd
from dflash_chat.runtime.endpoint import Endpoint, ServerError, error_text, short_line, tokens_text
from dflash_chat.runtime.live_stats import LiveStats
from dflash_chat.runtime.prompt import ThinkingSplitter
from dflash_chat.runtime.tool_calls import ToolCall

MAX_ERROR_BODY = 64 * 1024  # of a refusal's body, read to quote its message
MAX_WHOLE_BODY = 16 * 1024 * 1024  # of a reply that is one JSON object instead of a stream


def read_capped(response, limit: int) -> bytes:
    parts, size = [], 0
    for part in response.iter_bytes():
        parts.append(part)
        size += len(part)
        if size >= limit:
            break
    return b"".join(parts)[:limit]


class Reader:
    """One streamed answer: SSE lines in, batched StreamChunks out, the figures at the end."""

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
        self.finish: str | None = None
        self.usage: dict = {}
        self.acceptance: openai_protocol.Acceptance | None = None
        self.calls = openai_protocol.StreamedCalls()
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
                raise ServerError(error_text(response.status_code, read_capped(response, MAX_ERROR_BODY), endpoint))
            self.opened_at = time.monotonic()
            kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
            if kind == "application/json":  # a server that ignored "stream": one whole completion
                return self._whole(read_capped(response, MAX_WHOLE_BODY))
            if kind != "text/event-stream":
                raise ServerError(
                    f"{endpoint.host} did not answer with an OpenAI stream (it sent "
                    f"{short_line(kind, 40) or 'no content type'}): check that the URL is the server's /v1"
                )
            done = self._stream(response.iter_lines())
        if self.request.cancel.is_set() and not done and self.finish is None:
            return self.end("cancelled")
        if self.error:
            return self.end("error" if not self.has_text() else "cut")
        if not done and self.finish is None:
            self.error = (
                f"the stream from {endpoint.host} ended without a finish ([DONE] or finish_reason) "
                f"after {tokens_text(self.new_tokens())}"
            )
            return self.end("cut" if self.has_text() else "error")
        return self.end("length" if self.finish == "length" else "stop")

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
                f"{self.host} sent something that is not an OpenAI stream chunk after {tokens_text(self.new_tokens())}"
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
        return self.end(("length" if self.finish == "length" else "stop") if self.finish else "cut")

    def cut_short(self) -> StreamEnd:
        """The answer as far as it came, when Esc cut the connection mid-read."""
        return self.end("cancelled")

    def broken(self, why: str) -> StreamEnd:
        """The answer as far as it came, when the connection or the protocol failed: cut, with why."""
        self.error = why
        return self.end("cut" if self.has_text() else "error")

    def has_text(self) -> bool:
        return bool(self.thinking or self.answer or self.calls.parts)

    def end(self, reason: str) -> StreamEnd:
        self._feed(*self.splitter.flush())
        calls = self.calls.calls() if reason in ("stop", "length") else ()  # a call cut mid-way is no call
        if any(self.pending) or calls:
            self.send(calls)
        stats = self.stats(time.monotonic())
        source = self.acceptance.source if self.acceptance is not None else None
        return StreamEnd(
            reason,
            "".join(self.thinking),
            "".join(self.answer),
            stats,
            self.error,
            acceptance_source=source,
            tool_calls=calls,
        )

    def take(self, chunk: dict, now: float) -> None:
        if "error" in chunk and not chunk.get("choices"):
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            message = short_line(message) if isinstance(message, str) and message.strip() else "no reason given"
            self.error = f"the server failed after {tokens_text(self.new_tokens())}: {message}"
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
            self.calls.take(delta.get("tool_calls"))
            if reasoning or content or delta.get("tool_calls"):
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

    def send(self, calls: tuple[ToolCall, ...] = ()) -> None:
        live = self.live
        live.new_tokens = self.new_tokens()
        live.prompt_tokens = self.usage.get("prompt_tokens") or 0
        if self.first is not None:
            live.ttft_s = self.first - self.started
            live.decode_s = self.last - self.first
        self.post(StreamChunk(self.pending[0], self.pending[1], live.snapshot(), calls))
        self.pending = ["", ""]

    def stats(self, now: float) -> GenerationStats:
        details = self.usage.get("prompt_tokens_details") or {}
        reused = details.get("cached_tokens") if isinstance(details, dict) else None
        if not isinstance(reused, int):
            cached_n = self.usage.get("cached_n")
            reused = cached_n if isinstance(cached_n, int) else 0
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


def with_acceptance(end: StreamEnd, acceptance: openai_protocol.Acceptance) -> StreamEnd:
    assert end.stats is not None  # only an answer with figures gets the server's draft figures
    return replace(end, stats=_stats_with(end.stats, acceptance), acceptance_source=acceptance.source)
