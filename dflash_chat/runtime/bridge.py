"""The worker side of a streamed answer: engine events in, a few batched updates out.

Runs in a thread worker. Every Step's tokens are decoded and split into
thinking and answer text at once, but `post` is called only every `interval`
seconds (about 25 times a second), so the UI handles a batch, never a token;
the first token is posted the moment it exists. `post` must not block
(Textual's post_message from a thread does not). With tools offered, the answer
text goes through a CallStream (runtime/tool_calls.py): chunks carry the content
up to a call, never a partial tag, and each call once it is whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from dflash_chat.engine.events import Event, Finished, GenerationStats, Prefilled
from dflash_chat.errors import one_line
from dflash_chat.runtime.detokenize import IncrementalDecoder
from dflash_chat.runtime.live_stats import LiveStats
from dflash_chat.runtime.stops import StopStrings
from dflash_chat.runtime.tool_calls import CallStream, ToolCall

POST_INTERVAL_S = 0.04


class Splitter(Protocol):
    """Text in, (thinking, answer) out: runtime/prompt.py's ThinkingSplitter, or one that calls it all answer."""

    def feed(self, text: str) -> tuple[str, str]: ...

    def flush(self) -> tuple[str, str]: ...


@dataclass(frozen=True)
class StreamChunk:
    """New text since the last chunk, and the running figures."""

    thinking: str
    answer: str
    live: LiveStats
    tool_calls: tuple[ToolCall, ...] = ()  # calls completed since the last chunk


@dataclass(frozen=True)
class StreamEnd:
    """The answer is over; the full texts, and the engine's own stats when it finished."""

    reason: str  # stop | length | cancelled | error | cut (a remote answer whose stream broke; text kept)
    thinking: str
    answer: str
    stats: GenerationStats | None
    error: str | None = None
    token_ids: tuple[int, ...] = ()  # every token the engine wrote, stop token included
    stopped_by_text: bool = False  # a stop string ended it (the engine holds tokens past the answer)
    stop_text: str | None = None  # that stop string
    acceptance_source: str | None = None  # a remote answer: which report its draft figures came from
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the answer made (its text is `answer` without them)


def stream_answer(
    events: Iterable[Event],
    decoder: IncrementalDecoder,
    splitter: Splitter,
    post: Callable[[StreamChunk], None],
    *,
    interval: float = POST_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    stops: StopStrings | None = None,
    cancel: threading.Event | None = None,
    draft: str = "",
    calls: CallStream | None = None,
    one_call: bool = False,
) -> StreamEnd:
    """Drain `events`, posting StreamChunks at most every `interval` s (the first token at once);
    returns how the answer ended. With `stops`, text ends before the first stop string and `cancel`
    (the engine's flag) is set, so the engine ends at its next step; the answer ended by "stop".
    `draft`: the engine's draft setting, for the running figures. `calls`: the answer's tool calls are
    parsed out of its text; with `one_call` the answer ends after the first (as a stop string ends it)."""
    start = clock()
    last_post = start
    live = LiveStats(draft=draft)
    thinking_parts: list[str] = []
    answer_parts: list[str] = []
    pending_thinking: list[str] = []
    pending_answer: list[str] = []
    made: list[ToolCall] = []
    pending_calls: list[ToolCall] = []
    written: list[int] = []

    def take(pieces: tuple[str, str]) -> None:
        think, answer = pieces
        if think:
            thinking_parts.append(think)
            pending_thinking.append(think)
        for piece in calls.feed(answer) if calls is not None and answer else [answer]:
            add_answer(piece)

    def add_answer(piece: str | ToolCall) -> None:
        if isinstance(piece, ToolCall):
            made.append(piece)
            pending_calls.append(piece)
            if one_call and cancel is not None:
                cancel.set()
        elif piece:
            answer_parts.append(piece)
            pending_answer.append(piece)

    def send_chunk() -> None:
        post(StreamChunk("".join(pending_thinking), "".join(pending_answer), live.snapshot(), tuple(pending_calls)))
        pending_thinking.clear()
        pending_answer.clear()
        pending_calls.clear()

    reason, stats, error = "error", None, None
    try:
        for event in events:
            if isinstance(event, Prefilled):
                live.on_prefilled(event)
                continue  # the prefill's token comes next, back to back: it is the first post
            if isinstance(event, Finished):
                reason, stats, error = event.reason, event.stats, event.error
                break
            first = not written  # a Step: the first one is the prefill's token
            live.on_step(event, clock() - start)
            written.extend(event.token_ids)
            text = decoder.push(event.token_ids)
            if stops is not None:
                text = stops.feed(text)
                if stops.matched and cancel is not None:
                    cancel.set()
            take(splitter.feed(text))
            now = clock()
            if first or now - last_post >= interval:
                send_chunk()
                last_post = now
        else:
            error = "the engine stopped without finishing the answer"
    except Exception as exc:  # noqa: BLE001 - any failure ends this answer, not the app
        reason, error = "error", one_line(exc, "generation")
    tail = decoder.flush()
    if stops is not None:
        tail = stops.feed(tail) + stops.flush()
    take(splitter.feed(tail))
    take(splitter.flush())
    for piece in calls.flush() if calls is not None else ():
        add_answer(piece)
    if pending_thinking or pending_answer or pending_calls:
        send_chunk()
    matched = stops is not None and stops.matched
    if (matched or (one_call and made)) and reason in ("cancelled", "length", "stop"):
        reason = "stop"
    return StreamEnd(
        reason,
        "".join(thinking_parts),
        "".join(answer_parts),
        stats,
        error,
        tuple(written),
        stopped_by_text=matched,
        stop_text=stops.which if stops is not None else None,
        tool_calls=tuple(made),
    )
