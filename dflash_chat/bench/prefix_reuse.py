"""What a branch costs: first-token times through each of serve's dialects for a short prompt, a long one cold,
the long conversation's second turn, and a branch that shares only its long system prompt.

One pair (the demo pair by default, loaded for a long context as `serve --demo --context N` loads it) is
served on loopback in this process. For each dialect (/v1/chat/completions, /v1/messages, /v1/responses), with
a system prompt of its own (so its first long request starts cold):
- `short`: a ~1k-token prompt, cold;
- `long_cold`: the ~25k-token system prompt and a question;
- `second_turn`: that conversation with its answer and one more question (the prompt extends what the engine
  holds exactly);
- `branch`: the same system prompt and another question (it shares only the system block: the engine resumes
  from its checkpoint there, engine/prefix_cache.py);
- `after_other`: the conversation's third turn after another conversation (a ~1k-token prompt with a system
  prompt of its own) ran in between: the engine parked the long one in host memory and brings it back
  (engine/parked.py).
Each time is from sending the streamed request to the first event that carries a generated token; each
request's reused prompt tokens come from its usage. The goal: second_turn, branch and after_other within 2x
of short.
"""

from __future__ import annotations

import json
import time

DIALECTS = ("chat", "messages", "responses")
ANSWER_TOKENS = 8
RESPONSES_TOKENS = 16  # OpenAI's Responses API takes no fewer max_output_tokens, so its clients send at least this


def system_prompt(tokenizer, tokens: int, tag: str) -> str:
    """A system prompt of about `tokens` tokens: numbered, varied tool descriptions, as an agent sends."""
    parts, count, i = [f"[{tag}] You are a coding agent. Use the tools below; answer briefly.\n"], 0, 0
    while count < tokens:
        line = (
            f"Tool {i}: read_file_{i}(path, offset={i % 97}, limit={i * 7 % 503}) reads lines of a file under the "
            f"workspace; errors when path {i} is outside it, returns at most {i * 13 % 4001} characters.\n"
        )
        parts.append(line)
        count += len(tokenizer.encode(line, add_special_tokens=False))
        i += 1
    return "".join(parts)


def _body(dialect: str, system: str, turns: list[dict]) -> tuple[str, dict]:
    if dialect == "chat":
        return "/v1/chat/completions", {
            "model": "bench",
            "messages": [{"role": "system", "content": system}, *turns],
            "max_tokens": ANSWER_TOKENS,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    if dialect == "messages":
        return "/v1/messages", {
            "model": "bench",
            "system": system,
            "messages": turns,
            "max_tokens": ANSWER_TOKENS,
            "temperature": 0,
            "stream": True,
        }
    return "/v1/responses", {
        "model": "bench",
        "instructions": system,
        "input": [{"type": "message", "role": t["role"], "content": t["content"]} for t in turns],
        "max_output_tokens": RESPONSES_TOKENS,
        "temperature": 0,
        "stream": True,
    }


def ask(client, url: str, dialect: str, system: str, turns: list[dict]) -> dict:
    """One streamed request: {first_token_s, total_s, text, prompt_tokens, cached_tokens}."""
    path, body = _body(dialect, system, turns)
    sent = time.perf_counter()
    first: float | None = None
    text: list[str] = []
    usage: dict = {}
    with client.stream("POST", url + path, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            piece = _piece(dialect, event)
            if piece is not None:
                first = first or time.perf_counter()
                text.append(piece)
            usage = _usage(dialect, event) or usage
    return {
        "first_token_s": (first or time.perf_counter()) - sent,
        "total_s": time.perf_counter() - sent,
        "text": "".join(text),
        **usage,
    }


def _piece(dialect: str, event: dict) -> str | None:
    """The generated text an event carries (None: it carries none)."""
    if dialect == "chat":
        choices = event.get("choices") or [{}]
        delta = choices[0].get("delta") or {}
        got = delta.get("content") or delta.get("reasoning_content")
        return got or None
    if dialect == "messages":
        if event.get("type") == "content_block_delta":
            delta = event["delta"]
            return delta.get("text") or delta.get("thinking") or delta.get("partial_json") or ""
        return None
    return event.get("delta", "") if event.get("type", "").endswith("_text.delta") else None


def _usage(dialect: str, event: dict) -> dict | None:
    if dialect == "chat" and event.get("usage"):
        u = event["usage"]
        return {"prompt_tokens": u["prompt_tokens"], "cached_tokens": u["prompt_tokens_details"]["cached_tokens"]}
    if dialect == "messages" and event.get("type") == "message_delta":
        u = event["usage"]
        cached = u["cache_read_input_tokens"]
        return {"prompt_tokens": u["input_tokens"] + cached, "cached_tokens": cached}
    if dialect == "responses" and event.get("type") in ("response.completed", "response.incomplete"):
        u = event["response"]["usage"]
        return {"prompt_tokens": u["input_tokens"], "cached_tokens": u["input_tokens_details"]["cached_tokens"]}
    return None


def run(pair, *, short: int = 1000, long: int = 25000, dialects: tuple[str, ...] = DIALECTS) -> dict:
    """The figures for a LoadedPair, by dialect."""
    from dflash_chat.runtime.endpoint import httpx_module
    from dflash_chat.runtime.session import EngineSession
    from dflash_chat.serve.served import Served
    from dflash_chat.serve.server import Running
    from dflash_chat.settings import Settings

    served = Served("bench", Settings(temperature=0.0, context_length=pair.engine.max_context))
    served.ready(EngineSession(pair))
    httpx = httpx_module()
    q1, q2, q3 = "Which tool reads a file?", "And how many characters at most?", "Which tool would list a folder?"
    figures: dict = {}
    with Running(served) as running, httpx.Client(timeout=900) as client:
        url = running.url
        ask(client, url, "chat", "warm up", [{"role": "user", "content": "hi"}])
        for dialect in dialects:
            tok = pair.tokenizer
            row = {"short": ask(client, url, dialect, system_prompt(tok, short, f"{dialect} short"), [_user(q1)])}
            system = system_prompt(tok, long, dialect)
            row["long_cold"] = first = ask(client, url, dialect, system, [_user(q1)])
            turns = [_user(q1), {"role": "assistant", "content": first["text"]}, _user(q2)]
            row["second_turn"] = ask(client, url, dialect, system, turns)
            row["branch"] = ask(client, url, dialect, system, [_user(q3)])
            ask(client, url, dialect, system_prompt(tok, short, f"{dialect} other"), [_user(q1)])
            turns = [_user(q3), {"role": "assistant", "content": row["branch"]["text"]}, _user(q2)]
            row["after_other"] = ask(client, url, dialect, system, turns)
            short_s = row["short"]["first_token_s"]
            for name in ("second_turn", "branch", "after_other"):
                row[name]["vs_short"] = row[name]["first_token_s"] / short_s
            figures[dialect] = row
    return figures


def _user(text: str) -> dict:
    return {"role": "user", "content": text}


def report(figures: dict) -> str:
    lines = [
        "dialect    short  long_cold  second_turn  branch  after_other   (first-token seconds; reused/prompt tokens)"
    ]
    for dialect, row in figures.items():
        cells = [
            f"{row[k]['first_token_s']:.2f}s ({row[k].get('cached_tokens')}/{row[k].get('prompt_tokens')})" for k in row
        ]
        lines.append(f"{dialect:<10} " + "  ".join(cells))
    return "\n".join(lines)


def main() -> None:
    import argparse
    import os
    import platform
    import subprocess
    from datetime import datetime, timezone
    from pathlib import Path

    import torch

    from dflash_chat.engine.load import load_pair
    from dflash_chat.models.demo import demo_paths

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=65536)
    parser.add_argument("--short", type=int, default=1000)
    parser.add_argument("--long", type=int, default=25000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.perf_counter()
    pair = load_pair(*demo_paths(), device="cpu", max_context=args.context)
    loaded_s = time.perf_counter() - started
    figures = run(pair, short=args.short, long=args.long)
    print(report(figures))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {
        "what": "first-token time through serve's three dialects on the demo pair (DFlash2 drafter, greedy), "
        f"context {args.context}: a {args.short}-token prompt, a {args.long}-token system prompt cold, that "
        "conversation's second turn, a branch sharing only the system prompt, and the branch's next turn after "
        "another conversation ran in between",
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "device": "cpu",
            "note": "2 cores shared with other work",
        },
        "load_s": loaded_s,
        "figures": figures,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
