"""From a conversation to the token ids the engine gets, and from its output back to
thinking and answer text.

The chat template comes with the tokenizer (transformers' apply_chat_template);
`enable_thinking` is the template flag Qwen3.x uses. With thinking on, Qwen3.6's
generation prompt already opens `<think>`, so the model's first words are
thinking; with it off the prompt carries an empty think block. Tools go to the
template as `tools=` (OpenAI's shape), as transformers passes them; a forced
call's first words (runtime/tool_use.py) end the prompt.

A turn is a message dict as the template reads it: `role` and `content`, and for
tool use an assistant's `tool_calls` (arguments as a mapping) or a `tool` turn's
`tool_call_id`. A content of parts may hold images (runtime/images.py): the prompt's
ids then have each image's placeholder expanded, and the prompt carries the images.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dflash_chat.engine.end_tokens import token_id
from dflash_chat.errors import UserError
from dflash_chat.runtime.images import Vision, turn_images, with_images
from dflash_chat.runtime.tool_use import ToolUse

if TYPE_CHECKING:
    from dflash_chat.engine.images import PromptImage

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CLOSE_THINKING = "\n</think>\n\n"  # what the template writes after an empty think block's opening

Turn = dict[str, Any]


class TemplateRefused(UserError):
    """The model's chat template raised on these turns (its own `raise_exception`): the turns' fault, which serve
    answers with a 400 and the chat shows in one line."""


@dataclass(frozen=True)
class Prompt:
    text: str
    ids: list[int]
    thinking: bool  # the flag passed to the template
    tools: tuple[str, ...] = ()  # the names of the tools the template was given
    opening: str = ""  # the assistant's first words, written into the prompt (a forced tool call, a prefill)
    images: tuple[PromptImage, ...] = ()  # the images of its placeholder runs, in order (engine/images.py)

    @property
    def opens_thinking(self) -> bool:
        """True when the prompt ends inside an open <think> block."""
        return self.text.rfind(THINK_OPEN) > self.text.rfind(THINK_CLOSE)


def build_prompt(
    tokenizer,
    turns: list[Turn],
    *,
    thinking: bool,
    tool_use: ToolUse | None = None,
    vision: Vision | None = None,
) -> Prompt:
    """The chat rendered by the model's template (with the tools offered, and a forced call's opening after
    it), and its token ids; the turns' images shown through `vision` (the pair's; None: it has none)."""
    tools, opening = _tool_args(tool_use)
    text = render_prompt(tokenizer, turns, thinking=thinking, tools=tools, opening=opening)
    ids, images = with_images(encode(tokenizer, text), turn_images(turns), vision)
    return Prompt(text, ids, thinking, _names(tools), opening, images)


def _tool_args(tool_use: ToolUse | None) -> tuple[list[dict] | None, str]:
    """(the tools as the template takes them, the opening) of a ToolUse."""
    return (tool_use.template_tools(), tool_use.opening()) if tool_use is not None else (None, "")


def render_prompt(
    tokenizer, turns: list[Turn], *, thinking: bool, tools: list[dict] | None = None, opening: str = ""
) -> str:
    """The chat as the template writes it, ending with the generation prompt and `opening` (no tokenizing).
    An opening after an open think block closes it first: a forced call is written without thinking."""
    if not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "the model's tokenizer has no chat template; use a target directory whose "
            "tokenizer_config.json (or chat_template.jinja) has one"
        )
    from jinja2.exceptions import TemplateError

    try:
        text = tokenizer.apply_chat_template(
            turns, tools=tools, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
        )
    except TemplateError as exc:  # the template's own raise_exception (Qwen's: an image in the system turn)
        raise TemplateRefused(f"the model's chat template refuses this chat: {exc}") from None
    if opening and text.rfind(THINK_OPEN) > text.rfind(THINK_CLOSE):
        text = text.rstrip("\n") + CLOSE_THINKING
    return text + opening


def _names(tools: list[dict] | None) -> tuple[str, ...]:
    return tuple(str(tool.get("function", tool).get("name", "")) for tool in tools or ())


def branch_marks(tokenizer, ids: list[int]) -> tuple[int, ...]:
    """Where later prompts are likely to branch from this one: the start of its first user turn, the end of the
    system prompt and tools that agents resend with every side request (the engine keeps a checkpoint there,
    engine/prefix_cache.py). None when the prompt starts with the user's turn or the template writes no
    `<|im_start|>user`."""
    start = token_id(tokenizer, "<|im_start|>")
    if start is None:
        return ()
    user = encode(tokenizer, "user")
    at = 0
    while True:
        try:
            at = ids.index(start, at + 1)
        except ValueError:
            return ()
        if ids[at + 1 : at + 1 + len(user)] == user:
            return (at,)


def encode(tokenizer, text: str) -> list[int]:
    """Token ids of rendered text (the template writes the special tokens itself)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


class ThinkingSplitter:
    """Splits streamed model text into (thinking, answer) pieces at the think tags.

    Tags can arrive cut across chunks; text that might be the start of a tag is
    held back until the next chunk says what it is.
    """

    def __init__(self, *, thinking: bool) -> None:
        self.in_thinking = thinking
        self.seen_answer = False
        self._held = ""
        self._strip_answer_start = False

    def feed(self, text: str) -> tuple[str, str]:
        text = self._held + text
        self._held = ""
        thinking: list[str] = []
        answer: list[str] = []
        while text:
            tag = THINK_CLOSE if self.in_thinking else THINK_OPEN
            at = text.find(tag)
            if at >= 0:
                self._emit(text[:at], thinking, answer)
                text = text[at + len(tag) :]
                if self.in_thinking:
                    self.in_thinking = False
                    self._strip_answer_start = True
                elif not self.seen_answer:
                    self.in_thinking = True
                else:  # a think tag in the middle of an answer is just text
                    self._emit(tag, thinking, answer)
                continue
            keep = _partial_tag_suffix(text, tag)
            self._emit(text[: len(text) - keep], thinking, answer)
            self._held = text[len(text) - keep :]
            break
        return "".join(thinking), "".join(answer)

    def flush(self) -> tuple[str, str]:
        held, self._held = self._held, ""
        thinking: list[str] = []
        answer: list[str] = []
        self._emit(held, thinking, answer)
        return "".join(thinking), "".join(answer)

    def _emit(self, text: str, thinking: list[str], answer: list[str]) -> None:
        if not text:
            return
        if self.in_thinking:
            thinking.append(text)
            return
        if self._strip_answer_start or not self.seen_answer:
            text = text.lstrip("\n")
            if not text:
                return
            self._strip_answer_start = False
        if text.strip():
            self.seen_answer = True
        answer.append(text)


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a proper start of `tag`."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


@dataclass(frozen=True)
class Transcript:
    """What the engine holds after an answer: the prompt it got and the tokens it wrote."""

    turns: list[Turn]  # the turns the prompt was built from
    prompt: Prompt
    answer_ids: list[int]
    answer: str
    thinking_text: str

    @property
    def ids(self) -> list[int]:
        return self.prompt.ids + self.answer_ids


def next_prompt(
    tokenizer,
    turns: list[Turn],
    *,
    thinking: bool,
    previous: Transcript | None = None,
    tool_use: ToolUse | None = None,
    prefill: str = "",
    vision: Vision | None = None,
) -> Prompt:
    """The prompt for the next answer, built so the engine can reuse its state; `prefill`: the answer's first
    words, written after the generation prompt (as a forced call's opening is) for the model to go on from; the
    turns' images shown through `vision`, as `build_prompt` does.

    The engine keeps every token it has seen and prefills only what follows
    them. Re-rendering the whole chat would not start with those tokens when
    the template rewrites earlier answers (Qwen's drops their think blocks), so:
    - the same turns again (regenerate): the very same prompt;
    - one more user turn after an answer without thinking: the tokens the
      engine holds, the end of that turn, then the new turn as the template
      renders it;
    - anything else: the whole chat rendered afresh.
    Answers that thought are re-rendered, so their reasoning leaves the context
    as the template intends. Tools and a forced opening are part of what must
    match: the tools render into the system turn.
    """
    tools, opening = _tool_args(tool_use)
    opening += prefill
    if (
        previous is not None
        and turns == previous.turns
        and (thinking, _names(tools), opening)
        == (previous.prompt.thinking, previous.prompt.tools, previous.prompt.opening)
    ):
        return previous.prompt
    text = render_prompt(tokenizer, turns, thinking=thinking, tools=tools, opening=opening)
    if previous is not None and not previous.thinking_text and not opening and not previous.prompt.opening:
        continued = _continue(tokenizer, turns, text, thinking, previous, tools, vision)
        if continued is not None:
            return continued
    ids, images = with_images(encode(tokenizer, text), turn_images(turns), vision)
    return Prompt(text, ids, thinking, _names(tools), opening, images)


def continuing_prompt(
    tokenizer,
    turns: list[Turn],
    *,
    thinking: bool,
    held: list[Transcript],
    tool_use: ToolUse | None = None,
    prefill: str = "",
    vision: Vision | None = None,
) -> Prompt:
    """`next_prompt` for a chat that may continue any of `held`: what the engine holds first, then the
    conversations it parked (engine/parked.py), newest first. A parked conversation comes back only when the
    prompt starts with exactly its tokens, so its next turn is built as the held one's is: an exact continuation
    (a re-render would part from it at the empty think block the template writes into the newest answer only).
    Turns with images match by the images' pixels, and the engine holds their tokens by content hash, so an earlier
    image sent again continues its conversation; `vision` shows the turns' images (as `next_prompt`)."""
    for previous in held:
        if turns == previous.turns or turns[: len(previous.turns) + 1] == _answered(previous):
            prompt = next_prompt(
                tokenizer,
                turns,
                thinking=thinking,
                previous=previous,
                tool_use=tool_use,
                prefill=prefill,
                vision=vision,
            )
            if prompt is previous.prompt or prompt.ids[: len(previous.ids)] == previous.ids:
                return prompt
    return next_prompt(tokenizer, turns, thinking=thinking, tool_use=tool_use, prefill=prefill, vision=vision)


def _answered(previous: Transcript) -> list[Turn]:
    """The turns `previous` holds: its prompt's, and its answer."""
    return previous.turns + [{"role": "assistant", "content": previous.answer}]


def _continue(
    tokenizer, turns, text: str, thinking: bool, previous: Transcript, tools: list[dict] | None, vision: Vision | None
) -> Prompt | None:
    """The held tokens + the rest of `text` (the whole chat, rendered) after the answer they end with,
    or None when `text` does not hold that chat. Templates like Qwen's write an empty think block into
    the newest answer only, so the answer's own rendering is found between its header and its end."""
    answered = _answered(previous)
    if turns[: len(answered)] != answered or len(turns) == len(answered):
        return None
    im_end = token_id(tokenizer, "<|im_end|>")
    if im_end is None:
        return None
    if _names(tools) != previous.prompt.tools:
        return None
    head = tokenizer.apply_chat_template(previous.turns, tools=tools, tokenize=False, add_generation_prompt=False)
    opening, closing_tag = "<|im_start|>assistant\n", "<|im_end|>\n"
    if not text.startswith(head + opening):
        return None
    end = text.find(closing_tag, len(head) + len(opening))
    if end < 0 or not text[len(head) + len(opening) : end].endswith(previous.answer):
        return None
    rest = text[end + len(closing_tag) :]
    held = previous.ids
    closing = "\n" if held and held[-1] == im_end else closing_tag
    added, images = with_images(encode(tokenizer, closing + rest), turn_images(turns[len(answered) :]), vision)
    return Prompt(
        previous.prompt.text + previous.answer + closing + rest,
        held + added,
        thinking,
        previous.prompt.tools,
        images=previous.prompt.images + images,
    )
