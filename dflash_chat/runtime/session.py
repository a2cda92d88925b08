"""A loaded pair in use: prompts built for prefix reuse, answers streamed, what the engine now holds.

The engine keeps the tokens of its last answer and prefills only what a new prompt adds to them
(engine/spec.py). A `Transcript` says which chat those tokens are, so the next prompt of that chat
is built to start with them (runtime/prompt.py: next_prompt); runtime/answering.py keeps which chat that
is, for the chat app and `serve` alike. Runs in worker threads: no UI here, and torch only through the
engine.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from dflash_chat.engine import rules, speculation
from dflash_chat.runtime.bridge import StreamChunk, StreamEnd, stream_answer
from dflash_chat.runtime.constraint import OutputFormat, answer_constraint
from dflash_chat.runtime.detokenize import IncrementalDecoder
from dflash_chat.runtime.images import Vision
from dflash_chat.runtime.prompt import (
    Prompt,
    ThinkingSplitter,
    Transcript,
    Turn,
    branch_marks,
    encode,
    next_prompt,
)
from dflash_chat.runtime.stops import StopStrings
from dflash_chat.runtime.tool_calls import CallStream

if TYPE_CHECKING:
    from dflash_chat.engine.constraint import Constraint
    from dflash_chat.engine.draft_length import DraftMemory
    from dflash_chat.engine.load import LoadedPair
    from dflash_chat.engine.sampling_params import SamplingParams
    from dflash_chat.runtime.tool_use import ToolUse


class EngineSession:
    def __init__(self, pair: LoadedPair) -> None:
        self.pair = pair
        self.tokenizer = pair.tokenizer
        engine = pair.engine
        self.context = engine.max_context
        self.last: Transcript | None = None  # what the engine holds, when it is a chat answer
        # what turns with images need of the pair (None: it reads no images)
        self.vision = (
            Vision(engine.vision, engine.image_token_id)
            if engine.vision is not None and engine.image_token_id is not None
            else None
        )

    @property
    def speculative(self) -> bool:
        """Whether answers draft (some drafting method is in use)."""
        return bool(self.pair.engine.method_sizes)

    @property
    def spec_tokens(self) -> int:
        """The most drafts a verify step takes (0 when nothing drafts)."""
        return self.pair.engine.block_size - 1 if self.speculative else 0

    @property
    def draft(self) -> str:
        """The draft setting answers are written with, as GenerationStats says it ("off" when nothing drafts)."""
        return str(self.pair.engine.draft) if self.speculative else "off"

    def use_draft(self, draft: str | int, speculate: str | None = None) -> None:
        """Answers from now on verify `draft` drafts per step, drafted as `speculate` says (None: as now). Call it
        between answers, in the worker of the next one: the engine rebuilds its steps (and no longer holds the
        last answer's tokens). A method the pair lacks is a MissingMethod error."""
        engine = self.pair.engine
        if speculate is not None and engine.speculate != speculate:
            engine.set_speculate(speculate)
        draft, _ = rules.fit_draft(draft, speculation.width(engine.speculate, engine.most) - 1)  # as it loaded
        if engine.draft != draft:
            engine.set_draft(draft)

    def chat_prompt(
        self, turns: list[Turn], thinking: bool, previous: Transcript | None, tools: ToolUse | None = None
    ) -> Prompt:
        """The chat's next prompt, with the tools offered and a forced call's opening (runtime/tool_use.py); the
        turns' image parts shown to the model (runtime/images.py; a UserError when it reads none)."""
        return next_prompt(
            self.tokenizer, turns, thinking=thinking, previous=previous, tool_use=tools, vision=self.vision
        )

    def text_prompt(self, text: str) -> Prompt:
        """A prompt sent as it is (completions): no chat template."""
        return Prompt(text=text, ids=encode(self.tokenizer, text), thinking=False)

    def answer(
        self,
        prompt: Prompt,
        params: SamplingParams,
        cancel: threading.Event,
        post: Callable[[StreamChunk], None],
        *,
        thinking_split: bool = True,
        tap: Callable[[object], None] | None = None,
        memory: DraftMemory | None = None,
        tools: ToolUse | None = None,
        output: OutputFormat | None = None,
    ) -> StreamEnd:
        """Generate for `prompt`, posting batched chunks; the params' stop strings end the text before them.
        `thinking_split` False: every word is answer text (a raw completion). `tap` sees every engine event.
        `memory`: what the `auto` draft length has learned of this conversation (runtime/answering.py).
        `tools`: the calls the answer makes are parsed out of its text (the prompt was built with them), and
        held to the tools' grammar as `output` holds the answer to its JSON (runtime/constraint.py; a grammar
        the engine cannot compile is a GrammarError, before anything is generated)."""
        engine = self.pair.engine
        constraint = self.constraint(prompt, tools, output)
        grammar = self.pair.grammars.matcher(constraint) if constraint is not None else None
        splitter = ThinkingSplitter(thinking=prompt.opens_thinking) if thinking_split else _NoSplit()
        marks = branch_marks(self.tokenizer, prompt.ids)
        events = engine.generate(
            prompt.ids, params, cancel, memory=memory, marks=marks, grammar=grammar, images=prompt.images
        )
        return stream_answer(
            events if tap is None else _tapped(events, tap),
            IncrementalDecoder(self.tokenizer, engine.stop_ids(params)),
            splitter,
            post,
            stops=StopStrings(params.stop) if params.stop else None,
            cancel=cancel,
            draft=self.draft,
            calls=_calls(prompt, tools),
            one_call=tools is not None and not tools.parallel,
        )

    def constraint(self, prompt: Prompt, tools: ToolUse | None, output: OutputFormat | None) -> Constraint | None:
        """The answer's constraint, compiled (cached): a GrammarError here says what is wrong with it."""
        constraint = answer_constraint(prompt, tools, output)
        if constraint is not None:
            self.pair.grammars.compile(constraint)
        return constraint

    @staticmethod
    def held(turns: list[Turn], prompt: Prompt, end: StreamEnd) -> Transcript | None:
        """What the engine holds after `end`, as a chat a next prompt can continue; None when it is not
        one (an error may have dropped the state; after a stop string the tokens go past the answer; a
        tool call's turn is written back by the template in its own form)."""
        if end.reason == "error" or end.stopped_by_text or end.tool_calls or prompt.opening:
            return None
        return Transcript(turns, prompt, list(end.token_ids), end.answer, end.thinking)


def _calls(prompt: Prompt, tools: ToolUse | None) -> CallStream | None:
    """The parser of the answer's calls, already past a forced call's opening (it is prompt text)."""
    if tools is None or not tools.offered:
        return None
    calls = CallStream(tools.tools)
    if prompt.opening:
        calls.feed(prompt.opening)
    return calls


def _tapped(events, tap):
    for event in events:
        tap(event)
        yield event


class _NoSplit:
    def feed(self, text: str) -> tuple[str, str]:
        return "", text

    def flush(self) -> tuple[str, str]:
        return "", ""
