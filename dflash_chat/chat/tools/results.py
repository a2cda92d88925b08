"""A tool call's outcome as the model reads it back (a `tool` turn) and the chat shows it: always text, never a
traceback. An MCP result's content blocks become text (images and other binaries are described, not sent);
an answer longer than MAX_CHARS is cut, and says so; a failure, a timeout, a "no" from the user, Esc, or the
round limit is a result too, in one plain sentence, so the model can carry on from it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dflash_chat.chat.conversation import CANCELLED, COMPLETE, DENIED, ERROR, SKIPPED, TIMEOUT

MAX_CHARS = 16_000  # of one result, sent to the model (about 4k tokens)


@dataclass(frozen=True)
class ToolResult:
    status: str  # COMPLETE, ERROR, TIMEOUT, DENIED, CANCELLED or SKIPPED (chat/conversation.py)
    text: str

    @property
    def ran(self) -> bool:
        return self.status in (COMPLETE, ERROR, TIMEOUT)


def denied() -> ToolResult:
    return ToolResult(DENIED, "The user declined this call; it was not run.")


def stopped() -> ToolResult:
    return ToolResult(CANCELLED, "Not run: the user stopped the answer before this call ran.")


def cut_off() -> ToolResult:
    return ToolResult(CANCELLED, "Stopped: the user stopped the answer while this call ran; it has no result.")


def skipped(rounds: int) -> ToolResult:
    return ToolResult(
        SKIPPED, f"Not run: this message reached its limit of {rounds} rounds of tool calls (the mcp.rounds setting)."
    )


def timed_out(seconds: float) -> ToolResult:
    return ToolResult(
        TIMEOUT, f"The tool did not answer within {seconds:g} s (the mcp.timeout setting); it was stopped."
    )


def failed(why: str) -> ToolResult:
    return ToolResult(ERROR, f"The tool failed: {why}")


def not_run(why: str) -> ToolResult:
    return ToolResult(ERROR, f"Not run: {why}")


def from_mcp(result: Any, limit: int = MAX_CHARS) -> ToolResult:
    """An MCP CallToolResult as text: its content blocks in order (structured content when there are none)."""
    parts = [_block_text(block) for block in getattr(result, "content", None) or ()]
    structured = getattr(result, "structured_content", None)
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False, indent=1))
    text = cut("\n".join(part for part in parts if part), limit)
    if getattr(result, "is_error", False):
        return ToolResult(ERROR, f"The tool reported an error: {text or 'it gave no reason'}")
    return ToolResult(COMPLETE, text or "(the tool returned nothing)")


def cut(text: str, limit: int = MAX_CHARS) -> str:
    """`text`, or its first `limit` characters and a line that says how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[cut: the tool returned {len(text):,} characters; only the first {limit:,} are here]"


def _block_text(block: Any) -> str:
    """One content block as text: text as it is, a text resource's text, the rest described."""
    kind = getattr(block, "type", "")
    if kind == "text":
        return str(getattr(block, "text", ""))
    if kind in ("image", "audio"):
        data = getattr(block, "data", "") or ""
        return f"[{kind}: {getattr(block, 'mime_type', '') or 'unknown type'}, about {len(data) * 3 // 4:,} bytes]"
    if kind == "resource_link":
        return f"[resource: {getattr(block, 'uri', '')}]"
    if kind == "resource":
        resource = getattr(block, "resource", None)
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text
        return (
            f"[binary resource: {getattr(resource, 'uri', '')}, {getattr(resource, 'mime_type', '') or 'unknown type'}]"
        )
    return f"[{kind or 'unknown'} content]"
