from __future__ import annotations

import itertools

from dflash_chat.engine.errors import ContextLengthError
from dflash_chat.engine.events import Finished, GenerationStats, Prefilled, Step
from dflash_chat.errors import OUT_OF_MEMORY, one_line
from dflash_chat.runtime.bridge import StreamChunk, StreamEnd, stream_answer
from dflash_chat.runtime.detokenize import IncrementalDecoder
from dflash_chat.runtime.prompt import ThinkingSplitter


class Clock:
    """Advances a fixed amount each time it is read (the worker reads it once or twice per event)."""

    def __init__(self, tick: float) -> None:
        self.now = 0.0
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def events_for(tokenizer, text, block=4, reason="stop"):
    ids = tokenizer.encode(text, add_special_tokens=False)
    yield Prefilled(prompt_tokens=11, reused_tokens=3, seconds=0.01)
    yield Step(token_ids=ids[:1], drafted=0, accepted=0, draft_s=0.0, verify_s=0.0)  # the prefill's token
    for at in range(1, len(ids), block):
        chunk = ids[at : at + block]
        yield Step(token_ids=chunk, drafted=block - 1, accepted=len(chunk) - 1, draft_s=0.0, verify_s=0.0)
    stats = GenerationStats(prompt_tokens=11, new_tokens=len(ids), steps=-(-(len(ids) - 1) // block))
    yield Finished(reason=reason, stats=stats)


def run(tokenizer, events, tick=0.005, thinking=False, draft=""):
    posted = []
    end = stream_answer(
        events,
        IncrementalDecoder(tokenizer),
        ThinkingSplitter(thinking=thinking),
        posted.append,
        interval=0.04,
        clock=Clock(tick),
        draft=draft,
    )
    return posted, end


def test_updates_are_batched_and_lose_nothing(tokenizer):
    text = "<think>\nfirst a plan</think>\n\n" + "The quick brown fox jumps. " * 30
    posted, end = run(tokenizer, events_for(tokenizer, text), tick=0.0025)
    chunks = [p for p in posted if isinstance(p, StreamChunk)]
    steps = sum(1 for e in events_for(tokenizer, text) if isinstance(e, Step))
    assert chunks == posted and isinstance(end, StreamEnd)  # the end is returned, never posted
    assert steps > 40
    # two clock reads per step at 2.5 ms each: 40 ms pass every 8 steps
    assert steps // 8 <= len(chunks) <= steps // 8 + 2
    assert "".join(c.thinking for c in chunks) == end.thinking == "\nfirst a plan"
    assert "".join(c.answer for c in chunks) == end.answer == ("The quick brown fox jumps. " * 30)
    assert end.reason == "stop" and end.stats.new_tokens > 0


def test_the_first_token_is_posted_the_moment_it_exists(tokenizer):
    """After a slow prefill the engine yields Prefilled and the first Step back to back."""
    ids = tokenizer.encode("The quick brown fox jumps. " * 3, add_special_tokens=False)
    now = [0.0]

    def events():
        now[0] += 0.2  # a 200 ms prefill
        yield Prefilled(prompt_tokens=11, reused_tokens=0, seconds=0.2)
        yield Step(token_ids=ids[:1], drafted=0, accepted=0, draft_s=0.0, verify_s=0.0)
        for token in ids[1:]:
            now[0] += 0.01  # fast decode steps: several fit in one 40 ms batch
            yield Step(token_ids=[token], drafted=0, accepted=0, draft_s=0.0, verify_s=0.0)
        yield Finished(reason="stop", stats=GenerationStats(new_tokens=len(ids), steps=len(ids) - 1))

    posted = []
    end = stream_answer(
        events(),
        IncrementalDecoder(tokenizer),
        ThinkingSplitter(thinking=False),
        posted.append,
        interval=0.04,
        clock=lambda: now[0],
    )
    assert posted[0].answer == tokenizer.decode(ids[:1]) and posted[0].live.new_tokens == 1
    assert posted[0].live.ttft_s == 0.2
    assert all(chunk.answer for chunk in posted)  # no empty batch for the prefill
    assert "".join(chunk.answer for chunk in posted) == end.answer


def test_live_figures_follow_the_steps(tokenizer):
    text = "The quick brown fox jumps. " * 10
    posted, end = run(tokenizer, events_for(tokenizer, text, block=5), draft="auto")
    last = [p for p in posted if isinstance(p, StreamChunk)][-1].live
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert last.prompt_tokens == 11 and last.reused_tokens == 3
    assert last.new_tokens == len(ids)
    assert last.steps == -(-(len(ids) - 1) // 5)
    assert last.drafted == 4 * last.steps
    assert (last.draft, last.last_drafted, last.mean_draft_length) == ("auto", 4, 4.0)
    assert last.accepted == len(ids) - 1 - last.steps
    assert last.mean_acceptance_length == (len(ids) - 1) / last.steps
    assert last.decode_tokens_per_s > 0 and last.ttft_s is not None
    assert sum(last.recent_lengths) == len(ids) - 1  # fewer steps than the sparkline keeps


def test_an_engine_failure_keeps_the_partial_answer(tokenizer):
    def failing():
        gen = events_for(tokenizer, "Hello there, general. " * 4)
        yield from itertools.islice(gen, 4)
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    posted, end = run(tokenizer, failing())
    assert end.reason == "error" and end.error == OUT_OF_MEMORY
    assert end.answer and "Hello there, general. ".startswith(end.answer[:10])
    assert "".join(p.answer for p in posted if isinstance(p, StreamChunk)) == end.answer


def test_cancelled_run_reports_the_engine_reason(tokenizer):
    posted, end = run(tokenizer, events_for(tokenizer, "short", reason="cancelled"))
    assert end.reason == "cancelled" and end.answer == "short"


def test_failure_messages():
    assert one_line(ContextLengthError("prompt too long: raise context_length"), "generation") == (
        "prompt too long: raise context_length"
    )
    assert one_line(ValueError("bad"), "generation") == "generation failed (ValueError: bad)"
    assert one_line(MemoryError(), "loading the model") == OUT_OF_MEMORY


def test_out_of_memory_is_recognised_however_torch_words_it():
    import torch

    cpu = RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 12800000002048 bytes.")
    for exc in (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), cpu, MemoryError()):
        assert one_line(exc, "loading the model") == OUT_OF_MEMORY
    assert "generating" not in OUT_OF_MEMORY  # the same words fit a load and an answer


def test_tool_calls_come_out_of_the_answer_text_whole_and_in_order(tokenizer):
    """With a CallStream the answer's calls leave its text: chunks carry the content and each call once it is
    whole (never a partial tag), and the end holds the content and the calls as parse_calls reads them."""
    import threading

    from dflash_chat.runtime.tool_calls import CallStream, ToolSpec, parse_calls, render_call

    tools = [ToolSpec("lookup", parameters={"type": "object", "properties": {"n": {"type": "integer"}}})]
    text = "Let me look.\n\n" + render_call("lookup", {"n": 3}) + "\n" + render_call("lookup", {"n": 4})
    for one_call in (False, True):
        cancel = threading.Event()
        posted: list = []
        end = stream_answer(
            events_for(tokenizer, text, block=2),
            IncrementalDecoder(tokenizer),
            ThinkingSplitter(thinking=False),
            posted.append,
            clock=Clock(0.001),
            cancel=cancel,
            calls=CallStream(tools),
            one_call=one_call,
        )
        content, calls = parse_calls(text, tools)
        assert end.answer == "".join(c.answer for c in posted) == content == "Let me look."
        assert "<" not in end.answer and all("<tool" not in c.answer for c in posted)
        streamed = [call for c in posted for call in c.tool_calls]
        assert [(c.name, c.args()) for c in streamed] == [(c.name, c.args()) for c in end.tool_calls]
        assert [c.args() for c in end.tool_calls] == [c.args() for c in calls] == [{"n": 3}, {"n": 4}]
        # one call at most: the engine is told to stop after the first (these events ignore it), the end is "stop"
        assert cancel.is_set() == one_call and end.reason == "stop"
