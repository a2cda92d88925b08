"""Prometheus metrics under vLLM's names, so its dashboards and benchmark scripts read `serve` unchanged.

Every metric carries vLLM's labels (model_name, engine="0"). The spec-decode counters count what vLLM
counts: a verify step is a draft, its drafted and accepted tokens, and per draft position how often it
was accepted (a plain step, which `auto` and `off` take, is no draft). vLLM has no decode-speed or
draft-length histogram; ours are `dflash:decode_tokens_per_second` and `dflash:draft_length_per_step`. Each
API dialect's share is counted by route (`dflash:route_requests`, `..._draft_tokens`, `..._accepted_tokens`,
route = chat.completions, completions, messages or responses).
Each server has its own registry (tests run several in one process).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST as CONTENT_TYPE  # noqa: F401 - the app's /metrics header
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from dflash_chat.engine.events import GenerationStats
from dflash_chat.runtime.openai_protocol import (
    ACCEPTED_PER_POS,
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    DRAFTS,
    accepted_per_position,
    drafting_steps,
)

LABELS = ("model_name", "engine")
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
TOKEN_TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
SPEED_BUCKETS = (1, 2, 5, 10, 20, 35, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 2000)
DRAFT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class Metrics:
    def __init__(self, model_name: str, spec_tokens: int = 0) -> None:
        self.registry = registry = CollectorRegistry()
        self.labels = (model_name, "0")
        self.spec_tokens = spec_tokens

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()):
            return Counter(name, doc, LABELS + extra, registry=registry)

        def histogram(name: str, doc: str, buckets):
            return Histogram(name, doc, LABELS, buckets=buckets, registry=registry).labels(*self.labels)

        self.drafts = counter(DRAFTS, "Number of spec decoding drafts (verify steps).").labels(*self.labels)
        self.draft_tokens = counter(DRAFT_TOKENS, "Number of draft tokens.").labels(*self.labels)
        self.accepted_tokens = counter(ACCEPTED_TOKENS, "Number of accepted tokens.").labels(*self.labels)
        per_pos = counter(ACCEPTED_PER_POS, "Accepted tokens per draft position.", ("position",))
        self.accepted_per_pos = [per_pos.labels(*self.labels, str(p)) for p in range(spec_tokens)]
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.").labels(*self.labels)
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.").labels(
            *self.labels
        )
        self.cache_queries = counter(
            "vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        ).labels(*self.labels)
        self.cache_hits = counter("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.").labels(
            *self.labels
        )
        self.success = counter(
            "vllm:request_success", "Count of successfully processed requests.", ("finished_reason",)
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", LATENCY_BUCKETS
        )
        self.tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds (mean over each request).",
            TOKEN_TIME_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", LATENCY_BUCKETS
        )
        self.decode_speed = histogram(
            "dflash:decode_tokens_per_second",
            "Histogram of each request's decode speed (tokens after the first per second).",
            SPEED_BUCKETS,
        )
        self.draft_length = histogram(
            "dflash:draft_length_per_step",
            "Histogram of the drafts each decode step verified (0: a plain step).",
            DRAFT_BUCKETS,
        )
        self.by_route = {
            name: counter(f"dflash:route_{name}", doc, ("route",))
            for name, doc in (
                ("requests", "Answered requests by API route."),
                ("draft_tokens", "Draft tokens verified for each API route's answers."),
                ("accepted_tokens", "Draft tokens accepted in each API route's answers."),
            )
        }
        self.running = Gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches.", LABELS, registry=registry
        ).labels(*self.labels)
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", LABELS, registry=registry
        ).labels(*self.labels)

    def queue(self, running: int, waiting: int) -> None:
        self.running.set(running)
        self.waiting.set(waiting)

    def answered(
        self, stats: GenerationStats, reason: str, queued_s: float, total_s: float, route: str = "chat.completions"
    ) -> None:
        """One finished answer (its engine stats; `reason` as the API reports it; `route`: the API's)."""
        for name, count in (("requests", 1), ("draft_tokens", stats.drafted), ("accepted_tokens", stats.accepted)):
            self.by_route[name].labels(*self.labels, route).inc(count)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cache_queries.inc(stats.prompt_tokens)
        self.cache_hits.inc(stats.reused_tokens)
        self.generation_tokens.inc(stats.new_tokens)
        if stats.speculative:
            self.drafts.inc(drafting_steps(stats))
            self.draft_tokens.inc(stats.drafted)
            self.accepted_tokens.inc(stats.accepted)
            for counter, count in zip(
                self.accepted_per_pos, accepted_per_position(stats.acceptance_histogram), strict=False
            ):
                counter.inc(count)
            for drafts, steps in enumerate(stats.draft_histogram):
                for _ in range(steps):
                    self.draft_length.observe(drafts)
        self.success.labels(*self.labels, reason).inc()
        self.ttft.observe(stats.ttft_s)
        self.e2e.observe(total_s)
        self.queue_time.observe(queued_s)
        if stats.decoded_tokens > 0 and stats.decode_s > 0:
            self.tpot.observe(stats.decode_s / stats.decoded_tokens)
            self.decode_speed.observe(stats.decode_tokens_per_s)

    def text(self) -> bytes:
        return generate_latest(self.registry)
