"""A stand-in for a remote OpenAI-compatible server (vLLM or llama.cpp's), on loopback, stdlib only.

It streams a fixed answer in vLLM's chunk shape and serves a recorded vLLM /metrics text
(data/vllm_metrics.prom, as vLLM's prometheus_client writes it) whose draft counters grow by fixed
amounts with every answer, as a drafting vLLM's do. `mode` says what it reports of its drafts:
"counters" (vLLM without per-request metrics: only /metrics), "timings" (llama.cpp: `timings` in the
last chunk, no /metrics), or "none" (no figures at all). It imports no torch.
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

RECORDED = (Path(__file__).parent / "data" / "vllm_metrics.prom").read_text()
MODEL = "Qwen/Qwen3.6-27B"
ANSWER = ["A context manager ", "sets things up, ", "runs the block, ", "and cleans up afterwards."]
THINKING = ["The user asks about ", "with statements."]
COMPLETION_TOKENS = 73
PROMPT_TOKENS = 19
# what one answer adds to vLLM's counters: 10 verify steps, 150 drafted, 62 accepted
PER_POSITION = [9, 8, 8, 7, 6, 6, 5, 4, 3, 2, 2, 1, 1, 0, 0]
GROWTH = {
    "vllm:spec_decode_num_drafts_total": 10,
    "vllm:spec_decode_num_draft_tokens_total": 150,
    "vllm:spec_decode_num_accepted_tokens_total": sum(PER_POSITION),
}
TIMINGS = {
    "prompt_n": PROMPT_TOKENS,
    "prompt_ms": 12.5,
    "predicted_n": COMPLETION_TOKENS,
    "predicted_ms": 400.0,
    "predicted_per_second": 180.0,
    "draft_n": 96,
    "draft_n_accepted": 60,
}
SAMPLE = re.compile(r"^(vllm:spec_decode_num_\w+_total)\{([^}]*)\} (\S+)$", re.MULTILINE)


class StubServer:
    def __init__(self, mode: str = "counters") -> None:
        self.mode = mode
        self.answers = 0
        self.bodies: list[dict] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self.reply(
                        200,
                        {
                            "object": "list",
                            "data": [{"id": MODEL, "object": "model", "owned_by": "vllm", "max_model_len": 32768}],
                        },
                    )
                elif self.path == "/metrics" and stub.mode == "counters":
                    self.reply(200, stub.metrics(), "text/plain; version=0.0.4")
                else:
                    self.reply(404, {"error": {"message": "Not Found", "type": "NotFoundError", "code": 404}})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.bodies.append(body)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for chunk in stub.chunks(body):
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                stub.answers += 1  # vLLM's counters have grown by the time its stream ends
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def reply(self, status: int, body, kind: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def metrics(self) -> str:
        def grow(match: re.Match) -> str:
            name, labels, value = match.groups()
            if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                step = PER_POSITION[int(re.search(r'position="(\d+)"', labels)[1])]
            else:
                step = GROWTH[name]
            return f"{name}{{{labels}}} {float(value) + step * self.answers}"

        return SAMPLE.sub(grow, RECORDED)

    def chunks(self, body: dict):
        head = {"id": "chatcmpl-stub", "object": "chat.completion.chunk", "created": 1779344204, "model": MODEL}

        def delta(**fields) -> dict:
            return {**head, "choices": [{"index": 0, "delta": fields, "logprobs": None, "finish_reason": None}]}

        yield delta(role="assistant", content="")
        if (body.get("chat_template_kwargs") or {}).get("enable_thinking"):
            for piece in THINKING:
                yield delta(reasoning_content=piece)
        for piece in ANSWER:
            yield delta(content=piece)
        last = {
            **head,
            "choices": [
                {"index": 0, "delta": {"content": ""}, "logprobs": None, "finish_reason": "stop", "stop_reason": None}
            ],
        }
        if self.mode == "timings":
            last["timings"] = TIMINGS
        yield last
        if (body.get("stream_options") or {}).get("include_usage"):
            yield {
                **head,
                "choices": [],
                "usage": {
                    "prompt_tokens": PROMPT_TOKENS,
                    "completion_tokens": COMPLETION_TOKENS,
                    "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
                },
            }

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
