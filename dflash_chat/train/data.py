"""Token data for training: the packed stream for the target, and chat sequences for the drafter."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from dflash_chat.engine.end_tokens import end_token_ids
from dflash_chat.runtime.prompt import build_prompt, encode, render_prompt
from dflash_chat.runtime.tool_calls import ToolSpec, render_call
from dflash_chat.runtime.tool_use import ToolUse
from dflash_chat.train.corpus import Conversation
from dflash_chat.train.drafter import Sequence
from dflash_chat.train.target import Chat
from dflash_chat.train.tokenizer import training_text


def packed_tokens(tokenizer, conversations: list[Conversation]) -> torch.Tensor:
    """All training conversations as one token stream (each ends with <|im_end|>)."""
    texts = [training_text(tokenizer, c) for c in conversations]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    return torch.tensor([t for seq in ids for t in seq], dtype=torch.long)


def prompt_ids(tokenizer, conversation: Conversation, enable_thinking: bool) -> list[int]:
    """The prompt as the app builds it for this conversation (with its tools offered, if any)."""
    tool_use = None
    if conversation.tools:
        tool_use = ToolUse(tuple(ToolSpec.of_openai(tool) for tool in conversation.tools))
    return build_prompt(tokenizer, conversation.prompt_messages, thinking=enable_thinking, tool_use=tool_use).ids


def chat_tokens(tokenizer, conversation: Conversation) -> Chat:
    """A chat's ids as the engine meets them, turn by turn (each prompt as the app builds it, each answer
    tokenized alone), and labels on its assistant answers: a call (`tool_calls`) as the model writes it, the
    last answer after its thinking when `conversation.reasoning` is set."""
    tools = conversation.tools
    ids: list[int] = []
    labels: list[int] = []
    done = ""
    last = len(conversation.messages) - 1
    for k, message in enumerate(conversation.messages):
        if message["role"] != "assistant":
            continue
        thinking = k == last and conversation.reasoning is not None
        prompt = render_prompt(tokenizer, conversation.messages[:k], thinking=thinking, tools=tools)
        if not prompt.startswith(done):
            raise ValueError("the template renders the chat's earlier turns differently from their prompts")
        head = f"{conversation.reasoning}\n</think>\n\n" if thinking else ""
        calls = [c.get("function", c) for c in message.get("tool_calls") or ()]
        answer = head + message["content"] + "\n".join(render_call(c["name"], c["arguments"]) for c in calls)
        asked = encode(tokenizer, prompt[len(done) :])
        said = encode(tokenizer, answer + "<|im_end|>")
        ids += asked + said
        labels += [-100] * len(asked) + said
        done = prompt + answer + "<|im_end|>"
    return Chat(torch.tensor(ids), torch.tensor(labels))


def corpus_sequences(tokenizer, conversations: list[Conversation], max_len: int = 512) -> list[Sequence]:
    """Conversations as the template renders them; anchors start at the last prompt token."""
    out = []
    for conv in conversations:
        thinking = conv.reasoning is not None
        prompt = prompt_ids(tokenizer, conv, thinking)
        ids = tokenizer(training_text(tokenizer, conv), add_special_tokens=False)["input_ids"][:max_len]
        if len(ids) > len(prompt) + 1:
            out.append(Sequence(torch.tensor(ids), len(prompt) - 1))
    return out


@dataclass(frozen=True)
class Sampled:
    """How the target samples an answer (the app's defaults unless given)."""

    temperature: float
    top_p: float
    top_k: int


@torch.no_grad()
def target_answers(
    target,
    tokenizer,
    conversations: list[Conversation],
    *,
    max_new_tokens: int = 192,
    thinking_share: float = 0.2,
    batch_size: int = 64,
    seed: int = 0,
    device: str = "cpu",
    sampled: Sampled | None = None,
) -> list[Sequence]:
    """The target's own answers to the conversations' prompts (batched, left-padded): greedy, or drawn
    with `sampled`'s settings (seeded)."""
    rng = random.Random(seed)
    prompts = [prompt_ids(tokenizer, c, rng.random() < thinking_share) for c in conversations]
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # similar lengths batch together
    stop = list(end_token_ids(tokenizer))
    pad = tokenizer.pad_token_id
    target.to(device).eval()
    how: dict[str, bool | float | int] = {"do_sample": False}
    if sampled is not None:
        how = {"do_sample": True, "temperature": sampled.temperature, "top_p": sampled.top_p, "top_k": sampled.top_k}
        torch.manual_seed(seed)
    out: list[Sequence] = []
    for i in range(0, len(order), batch_size):
        chunk = [prompts[j] for j in order[i : i + batch_size]]
        width = max(len(p) for p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for row, p in enumerate(chunk):
            ids[row, width - len(p) :] = torch.tensor(p)
            attn[row, width - len(p) :] = 1
        gen = target.generate(
            input_ids=ids.to(device),
            attention_mask=attn.to(device),
            max_new_tokens=max_new_tokens,
            eos_token_id=stop,
            pad_token_id=pad,
            **how,
        )
        for row, p in enumerate(chunk):
            new = gen[row, width:].tolist()
            ends = [i for i, t in enumerate(new) if t in stop]
            if ends:
                new = new[: ends[0] + 1]
            new = [t for t in new if t != pad]
            if len(new) >= 2:
                out.append(Sequence(torch.tensor(p + new), len(p) - 1))
    return out
