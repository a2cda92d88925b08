"""What the OpenAI-compatible wire protocol says of sampling, tools and draft acceptance, both ways.

A request's sampling fields are `sampling_fields` (the remote backend sends them; serve/requests.py
reads them back into the same SamplingParams). Its tools are `tool_fields`, its messages `message_body`
(a call's arguments as JSON text), and the calls a stream sends back, in pieces by index, are put together
by `StreamedCalls`. The draft-acceptance figures come in three shapes exist in the field, and `serve` writes the first two:
- vLLM's per-request `metrics.speculative_decoding` object (its `--per-request-spec-decode-metrics`
  summary): `num_spec_steps`, `num_draft_tokens`, `num_accepted_draft_tokens`, `num_spec_tokens`,
  `acceptance_histogram` (index j: verify steps that accepted exactly j drafts; dense list, or a
  sparse {j: count} map in some builds), `draft_acceptance_rate`, `mean_acceptance_length`
  (1 + accepted / steps: the bonus token counted). We add the names of vLLM's Prometheus counters
  for the same request (`num_drafts`, `num_accepted_tokens`, `num_accepted_tokens_per_pos`).
- llama.cpp server's `timings`: `draft_n` drafted, `draft_n_accepted` accepted, `predicted_n`
  generated (so verify steps = predicted_n - 1 - accepted: the first token comes from the prompt).
- vLLM's Prometheus counters on /metrics: `vllm:spec_decode_num_drafts_total`,
  `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`, per position
  `..._num_accepted_tokens_per_pos_total{position=...}`; their difference around one answer is that
  answer's figures when nothing else ran meanwhile.

No torch, no HTTP here: plain dicts in, plain figures out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dflash_chat.engine.events import GenerationStats
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.runtime.tool_calls import ToolCall, new_call_id
from dflash_chat.runtime.tool_use import ToolUse

PER_REQUEST = "server per-request metrics"
TIMINGS = "llama.cpp timings"
COUNTERS = "vLLM /metrics counters"

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
SPEC_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED_TOKENS, ACCEPTED_PER_POS)


def sampling_fields(params: SamplingParams) -> dict:
    """A chat request's sampling fields for `params`, as vLLM, SGLang and llama.cpp read them; top-k and
    min-p only when they are on (OpenAI's own API has neither)."""
    body: dict = {"temperature": params.temperature, "top_p": params.top_p}
    if params.max_new_tokens is not None:
        body["max_tokens"] = params.max_new_tokens
    if params.top_k > 0:
        body["top_k"] = params.top_k
    if params.min_p > 0:
        body["min_p"] = params.min_p
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    return body


@dataclass(frozen=True)
class Acceptance:
    """One answer's draft figures as a server reported them, and which report they came from."""

    steps: int
    drafted: int
    accepted: int
    histogram: tuple[int, ...] = ()  # index j: verify steps that accepted exactly j drafts
    source: str = PER_REQUEST
    draft: str = ""  # the server's draft setting ("auto", "7"), when it says (ours does)


def tool_fields(tools: ToolUse) -> dict:
    """A chat request's `tools`, `tool_choice` and `parallel_tool_calls` for `tools` (offered ones)."""
    choice: Any = tools.choice
    if choice not in ("auto", "none", "required"):
        choice = {"type": "function", "function": {"name": choice}}
    return {
        "tools": [tool.as_openai() for tool in tools.tools],
        "tool_choice": choice,
        "parallel_tool_calls": tools.parallel,
    }


def message_body(turn: Mapping[str, Any]) -> dict:
    """A template turn (runtime/prompt.py) as an OpenAI chat message: a call's arguments as JSON text."""
    message = dict(turn)
    calls = turn.get("tool_calls")
    if calls:
        message["tool_calls"] = [
            {
                "id": call["id"],
                "type": "function",
                "function": {
                    "name": call["function"]["name"],
                    "arguments": json.dumps(call["function"].get("arguments") or {}, ensure_ascii=False),
                },
            }
            for call in calls
        ]
    return message


@dataclass
class StreamedCalls:
    """The calls of a streamed answer, put together from `delta.tool_calls` items: each item names its call
    by `index` and carries a piece of it (the id, type and name come first, the arguments' text in pieces),
    or the whole call (our serve, llama.cpp). An item without an index is a new call when it has an id (a
    whole message's list), else it continues the latest."""

    parts: dict[int, dict[str, Any]] = field(default_factory=dict)

    def take(self, items: Any) -> None:
        for item in items if isinstance(items, list) else ():
            if not isinstance(item, Mapping):
                continue
            index = item.get("index")
            if not isinstance(index, int) or isinstance(index, bool):  # a whole message's calls have no index
                index = len(self.parts) if item.get("id") or not self.parts else max(self.parts)
            part = self.parts.setdefault(index, {"id": "", "name": "", "arguments": ""})
            if isinstance(item.get("id"), str) and item["id"]:
                part["id"] = item["id"]
            function = item.get("function")
            if isinstance(function, Mapping):
                if isinstance(function.get("name"), str) and function["name"]:
                    part["name"] = function["name"]
                arguments = function.get("arguments")
                if isinstance(arguments, str):
                    part["arguments"] += arguments
                elif isinstance(arguments, Mapping):  # a server that sends them as an object
                    part["arguments"] = json.dumps(arguments, ensure_ascii=False)

    def calls(self) -> tuple[ToolCall, ...]:
        """The calls in index order (those without a name are no calls); arguments as sent ('{}' when none)."""
        return tuple(
            ToolCall(part["id"] or new_call_id(), part["name"], part["arguments"].strip() or "{}")
            for _, part in sorted(self.parts.items())
            if part["name"]
        )


def accepted_per_position(histogram: list[int] | tuple[int, ...]) -> list[int]:
    """Steps whose draft position i (0-based) was accepted: every step that accepted more than i drafts."""
    return [sum(histogram[i + 1 :]) for i in range(max(len(histogram) - 1, 0))]


def drafting_steps(stats: GenerationStats) -> int:
    """Decode steps that verified drafts (vLLM's "drafts"): `auto` and `off` also take plain steps, which
    the acceptance histogram leaves out."""
    return sum(stats.acceptance_histogram) if stats.acceptance_histogram else stats.steps


def speculative_decoding(stats: GenerationStats, spec_tokens: int) -> dict:
    """The `metrics.speculative_decoding` object of one answer, from the engine's own GenerationStats."""
    steps, drafted, accepted = stats.steps, stats.drafted, stats.accepted
    histogram = list(stats.acceptance_histogram)
    return {
        "num_spec_tokens": spec_tokens,
        "num_spec_steps": steps,
        "num_draft_tokens": drafted,
        "num_accepted_draft_tokens": accepted,
        "acceptance_histogram": histogram,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_acceptance_length": 1 + accepted / steps if steps else 1.0,
        # ours: the draft setting, and the drafts each step verified on average (0 for plain steps)
        "draft": stats.draft,
        "mean_draft_length": stats.mean_draft_length,
        # the same request in the names of vLLM's Prometheus counters
        "num_drafts": drafting_steps(stats),
        "num_accepted_tokens": accepted,
        "num_accepted_tokens_per_pos": accepted_per_position(histogram),
    }


def llama_timings(stats: GenerationStats) -> dict:
    """llama.cpp server's `timings` for one answer (milliseconds; draft fields only when it drafted)."""
    prompt_n = stats.prompt_tokens - stats.reused_tokens
    prompt_ms = stats.prefill_s * 1000
    predicted_ms = stats.decode_s * 1000
    timings = {
        "cache_n": stats.reused_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": prompt_n / stats.prefill_s if stats.prefill_s else 0.0,
        "predicted_n": stats.new_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / stats.decoded_tokens if stats.decoded_tokens > 0 else 0.0,
        "predicted_per_second": stats.decode_tokens_per_s,
    }
    if stats.speculative:
        timings.update(draft_n=stats.drafted, draft_n_accepted=stats.accepted)
    return timings


def _count(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def _dense(histogram) -> tuple[int, ...]:
    """A histogram as a dense tuple, from a list or a sparse {"j": count} map; () when unreadable."""
    if isinstance(histogram, list):
        counts = [_count(c) for c in histogram]
        dense = [c for c in counts if c is not None]
        return tuple(dense) if len(dense) == len(counts) else ()
    if isinstance(histogram, Mapping):
        try:
            read = {int(k): _count(v) for k, v in histogram.items()}
        except (TypeError, ValueError):
            return ()
        pairs = {k: v for k, v in read.items() if v is not None}
        if not pairs or len(pairs) != len(read) or any(k < 0 for k in pairs):
            return ()
        return tuple(pairs.get(j, 0) for j in range(max(pairs) + 1))
    return ()


def from_metrics(body: Mapping) -> Acceptance | None:
    """The figures in a response's (or final chunk's) `metrics.speculative_decoding`, if any."""
    metrics = body.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    if not isinstance(spec, Mapping):
        return None
    drafted = _count(spec.get("num_draft_tokens"))
    accepted = _count(spec.get("num_accepted_draft_tokens", spec.get("num_accepted_tokens")))
    steps = _count(spec.get("num_spec_steps", spec.get("num_drafts")))
    if drafted is None or accepted is None or steps is None:
        return None
    draft = spec.get("draft")
    return Acceptance(
        steps,
        drafted,
        accepted,
        _dense(spec.get("acceptance_histogram")),
        PER_REQUEST,
        draft if isinstance(draft, str) else "",
    )


def from_timings(body: Mapping) -> Acceptance | None:
    """The figures in llama.cpp's `timings` (absent unless it drafted)."""
    timings = body.get("timings")
    if not isinstance(timings, Mapping):
        return None
    drafted, accepted = _count(timings.get("draft_n")), _count(timings.get("draft_n_accepted"))
    if drafted is None or accepted is None:
        return None
    predicted = _count(timings.get("predicted_n")) or 0
    return Acceptance(max(predicted - 1 - accepted, 0), drafted, accepted, (), TIMINGS)


def read_counters(text: str) -> dict[str, float] | None:
    """vLLM's spec-decode counters in a /metrics text, summed over engines and models; per-position
    counts as f"{name}[{position}]". None when the text has none of them (not a drafting vLLM)."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name.removesuffix("_total")
                if name not in SPEC_COUNTERS or not sample.name.endswith("_total"):
                    continue
                if name == ACCEPTED_PER_POS:
                    name = f"{name}[{sample.labels.get('position', '0')}]"
                found[name] = found.get(name, 0.0) + sample.value
    except ValueError:  # not Prometheus text at all
        return None
    return found if DRAFTS in found else None


def from_counters(before: Mapping[str, float], after: Mapping[str, float]) -> Acceptance | None:
    """One answer's figures as the growth of vLLM's counters around it (None when they did not grow)."""

    def grew(name: str) -> int:
        return int(round(after.get(name, 0.0) - before.get(name, 0.0)))

    steps, drafted, accepted = grew(DRAFTS), grew(DRAFT_TOKENS), grew(ACCEPTED_TOKENS)
    if steps <= 0 or drafted < 0 or accepted < 0:
        return None
    positions = sorted(int(k[len(ACCEPTED_PER_POS) + 1 : -1]) for k in after if k.startswith(ACCEPTED_PER_POS + "["))
    at_least = [grew(f"{ACCEPTED_PER_POS}[{p}]") for p in positions]  # steps that accepted more than p drafts
    histogram: tuple[int, ...] = ()
    if at_least:
        counts = [steps - at_least[0]] + [a - b for a, b in zip(at_least, at_least[1:], strict=False)] + [at_least[-1]]
        histogram = tuple(counts) if all(c >= 0 for c in counts) else ()
    return Acceptance(steps, drafted, accepted, histogram, COUNTERS)
