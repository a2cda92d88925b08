"""A saved conversation as Markdown (the history screen's export), and the words the chat and the export use for
how an answer or a tool call ended."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from dflash_chat.chat.conversation import (
    CANCELLED,
    COMPLETE,
    DENIED,
    ERROR,
    PARTIAL,
    SKIPPED,
    TIMEOUT,
    Conversation,
    Message,
)
from dflash_chat.chat.images import Attachment
from dflash_chat.runtime.tool_calls import ToolCall


def to_markdown(conversation: Conversation, image_link: Callable[[Attachment], str | None] | None = None) -> str:
    """A conversation as a Markdown document (thinking, and each tool call with its result, kept in a
    collapsed <details>). A message's images are named with their hash; `image_link`: where an image's file is,
    relative to the document (None: nowhere, the reference stands alone)."""
    lines = [f"# {conversation.title}", ""]
    for message in conversation.messages:
        if message.role == "tool":
            continue  # shown with the call it answers
        lines.append("## You" if message.role == "user" else "## Assistant")
        lines.append("")
        for image in message.images:
            link = image_link(image) if image_link is not None else None
            alt = image.name.replace("[", "(").replace("]", ")")
            shown = f"![{alt}](<{link}>) " if link else ""
            lines += [f"{shown}*[image: {image.reference()}]*", ""]
        if message.thinking:
            lines += ["<details><summary>Thinking</summary>", "", message.thinking.strip(), "", "</details>", ""]
        lines.append(message.content.rstrip())
        if message.role == "assistant" and message.status != COMPLETE:
            why = f": {message.note}" if message.note else ""
            lines += ["", f"*({status_note(message.status)}{why})*"]
        for call in message.tool_calls:
            lines += ["", *_call_markdown(call, conversation.result(call.id))]
        lines.append("")
    return "\n".join(lines)


def export_markdown(conversation: Conversation, path: Path, images_folder: Path) -> None:
    """Write the conversation to `path` as Markdown, its images copied beside it (a folder named after the file,
    each image by its hash) so the document shows them; an image no longer stored is named only. OSError: the
    file or the folder could not be written."""
    import shutil

    found = {image.digest: image for m in conversation.messages for image in m.images}
    found = {d: image for d, image in found.items() if (images_folder / image.file_name).is_file()}
    beside = path.with_name(f"{path.stem}-images")
    if found:
        beside.mkdir(parents=True, exist_ok=True)
        for image in found.values():
            shutil.copyfile(images_folder / image.file_name, beside / image.file_name)

    def link(image: Attachment) -> str | None:
        return f"{beside.name}/{image.file_name}" if image.digest in found else None

    path.write_text(to_markdown(conversation, link), encoding="utf-8")


def _call_markdown(call: ToolCall, result: Message | None) -> list[str]:
    how = call_state(result.status) if result is not None else "no result"
    lines = [f"<details><summary>Tool call: {call.name} ({how})</summary>", "", "```json", call.arguments, "```"]
    if result is not None:
        lines += ["", "```", result.content, "```"]
    return [*lines, "", "</details>"]


def call_state(status: str) -> str:
    """How a tool call went, as its block in the chat and the Markdown export say it."""
    return {
        COMPLETE: "done",
        ERROR: "failed",
        TIMEOUT: "timed out",
        DENIED: "declined",
        CANCELLED: "stopped",
        SKIPPED: "not run: round limit",
    }.get(status, status)


def status_note(status: str) -> str:
    return {
        PARTIAL: "interrupted: the app stopped while this answer was written",
        "cancelled": "stopped",
        "cut": "cut short",
        "error": "failed",
    }.get(status, status)


def export_filename(title: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()[:60]
    return f"{slug or 'conversation'}.md"
