"""What HTTP costs: the same greedy answers in-process and through `serve`'s streaming API, timed.

One loaded pair answers the prompts twice: straight through runtime/session.py (as the app does), then
as streamed /v1/chat/completions requests to a server on loopback in this process (as a client
would). Each series starts after the same warm-up answer, so the engine holds the same tokens. The
figures: requests/s and tokens/s of each, their ratio, and the HTTP overhead per token.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.settings import Settings


@dataclass(frozen=True)
class Series:
    requests: int
    tokens: int
    seconds: float
    texts: tuple[str, ...]

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _in_process(session, chats: list[list[dict]], tokens: int) -> Series:
    texts, total, started = [], 0, time.perf_counter()
    for chat in chats:
        prompt = session.chat_prompt(chat, False, None)
        params = SamplingParams(temperature=0.0, max_new_tokens=tokens)
        end = session.answer(prompt, params, threading.Event(), lambda chunk: None)
        texts.append(end.answer)
        total += end.stats.new_tokens
    return Series(len(chats), total, time.perf_counter() - started, tuple(texts))


def _over_http(client, url: str, model: str, chats: list[list[dict]], tokens: int) -> Series:
    texts, total, started = [], 0, time.perf_counter()
    for chat in chats:
        body = {
            "model": model,
            "messages": chat,
            "max_tokens": tokens,
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        text = []
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data:") or line.endswith("[DONE]"):
                    continue
                chunk = json.loads(line[5:])
                for choice in chunk.get("choices") or []:
                    text.append(choice["delta"].get("content") or "")
                if chunk.get("usage"):
                    total += chunk["usage"]["completion_tokens"]
        texts.append("".join(text))
    return Series(len(chats), total, time.perf_counter() - started, tuple(texts))


def measure(*, demo: bool, target, drafter, prompts: int, tokens: int, device) -> tuple[str, dict]:
    """`bench --http`: the demo pair on its held-out chats, or a given pair on the plain bench's questions;
    the setup's title and the figures."""
    from dflash_chat.bench.pairs import REAL_QUESTIONS
    from dflash_chat.engine.load import load_pair

    if demo:
        from dflash_chat.models.demo import demo_heldout_prompts, demo_paths

        target, drafter = demo_paths()
        chats = demo_heldout_prompts()[:prompts]
        title = "embedded demo pair"
    else:
        chats = [[{"role": "user", "content": q}] for q in REAL_QUESTIONS][:prompts]
        title = f"{target} + {drafter}"
    pair = load_pair(target, drafter, device=device, max_context=4096)
    figures = run(pair, chats, tokens)
    title = (
        f"{title}: {len(chats)} chats, greedy, {tokens} new tokens at most, one at a time; "
        "in-process (the app's engine session) vs streamed through serve's HTTP API on loopback"
    )
    return title, figures


def run(pair, chats: list[list[dict]], tokens: int) -> dict:
    """Both series on `pair` (a LoadedPair); the figures as a dict."""
    from dflash_chat.runtime.endpoint import httpx_module
    from dflash_chat.runtime.session import EngineSession
    from dflash_chat.serve.served import Served
    from dflash_chat.serve.server import Running

    session = EngineSession(pair)
    warm = chats[0]
    _in_process(session, [warm], tokens)
    local = _in_process(session, chats, tokens)
    served = Served("bench", Settings())
    served.ready(session)
    httpx = httpx_module()
    with Running(served) as running, httpx.Client(timeout=120) as client:
        _over_http(client, running.url, "bench", [warm], tokens)
        remote = _over_http(client, running.url, "bench", chats, tokens)
    ms_per_token = 1000 * (remote.seconds - local.seconds) / max(remote.tokens, 1)
    return {
        "requests": local.requests,
        "max_tokens": tokens,
        "in_process": {
            "requests_per_s": local.requests_per_s,
            "tokens_per_s": local.tokens_per_s,
            "tokens": local.tokens,
            "seconds": local.seconds,
        },
        "http": {
            "requests_per_s": remote.requests_per_s,
            "tokens_per_s": remote.tokens_per_s,
            "tokens": remote.tokens,
            "seconds": remote.seconds,
        },
        "http_vs_in_process": remote.tokens_per_s / local.tokens_per_s if local.tokens_per_s else 0.0,
        "overhead_ms_per_token": ms_per_token,
        "same_text": local.texts == remote.texts,
    }


def report(figures: dict, title: str) -> str:
    local, remote = figures["in_process"], figures["http"]
    return "\n".join(
        [
            title,
            f"  in-process  {local['requests_per_s']:7.2f} req/s  {local['tokens_per_s']:8.1f} tok/s  "
            f"({local['tokens']} tokens in {local['seconds']:.2f} s)",
            f"  HTTP (SSE)  {remote['requests_per_s']:7.2f} req/s  {remote['tokens_per_s']:8.1f} tok/s  "
            f"({remote['tokens']} tokens in {remote['seconds']:.2f} s)",
            f"  HTTP / in-process: {figures['http_vs_in_process']:.3f}x tok/s; overhead "
            f"{figures['overhead_ms_per_token']:.2f} ms per token; same text: {'yes' if figures['same_text'] else 'NO'}",
        ]
    )
