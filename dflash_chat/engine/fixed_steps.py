"""Fixed-shape decode steps: the step's state on the device, each entry point one CUDA graph.

A step never reads a host value until its tokens are known. The committed length, the last token,
the tokens left and the stop ids live in small device tensors; every entry point has fixed shapes:
- draft: the drafter's B-token block at the committed length -> B-1 drafts (the verify block's rows 1..);
- verify: the target's B-token forward over [last, drafts] (speculative: GDN state untouched);
- accept: the verify rule on the device (greedy or sampling; one graph per sampling setting), the
  tokens to emit cut at a stop token and at the tokens left;
- commit: GDN layers keep the accepted prefix (a masked matmul), the drafter stores the whole block's
  context (rows past the accepted ones are overwritten before they are read), length and last token move;
- decode (no drafter): the target's 1-token forward, then accept and commit of that token.
The only host read per step is the result ([tokens, n, accepted], B+2 ints) through pinned memory,
and the next draft is queued before that read. On CUDA each entry point is captured once, after a
warm-up that runs every first-use check (kernel self-checks, Triton compiles), and replayed; when
capture fails the same functions run uncaptured (with a warning), with the same results.
"""

from __future__ import annotations

import time
import warnings

import torch

from dflash_chat.engine.events import Step
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.sampling import Draws, SamplingParams, accept

MAX_STOPS = 16  # stop ids a step checks on the device (the chat templates use 2-3)


def _mark(device: torch.device):
    if device.type != "cuda":
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _seconds(begin, end) -> float:
    if isinstance(begin, float):
        return end - begin
    return begin.elapsed_time(end) / 1000


class FixedSteps:
    def __init__(self, engine, graphs: bool):
        self.engine = engine
        self.target = engine.target
        self.drafter = engine.drafter
        self.state = engine.state
        self.device = dev = engine.device
        self.B = engine.block_size
        self.rows = self.state.max_len  # cache rows a reference path reads
        long = dict(dtype=torch.long, device=dev)
        self.start = torch.zeros((), **long)  # committed length
        self.remaining = torch.zeros((), **long)  # tokens the answer may still emit
        self.stop_ids = torch.full((MAX_STOPS,), -1, **long)
        self.offsets = torch.arange(self.B, **long)
        self.block = self.drafter.block_ids(dev) if self.drafter else None  # the drafter's input
        self.ids = torch.zeros(self.B, **long)  # the verify input: [last, drafts]
        self.result = torch.zeros(self.B + 2, **long)  # accept's [tokens, n, accepted]
        self.host = torch.zeros(self.B + 2, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.logits = self.feats = None
        self.draws: Draws | None = None
        self.params = SamplingParams()
        self.generator: torch.Generator | None = None
        self.graphs: dict | None = None
        self.pending: list = []  # (kind, begin, end) intervals not yet counted
        self.host_s = 0.0  # host time the steps took: issuing them and reading their results (not the wait)
        if graphs:
            try:
                self._capture_all()
            except Exception as exc:  # noqa: BLE001 - any failure means: run the same steps uncaptured
                warnings.warn(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); decoding without graphs")
                self.graphs = None
                torch.cuda.synchronize(dev)
            engine.reset()

    # -- the entry points (fixed shapes, no host reads) ------------------------------
    def _span(self) -> Span:
        return Span.fixed(self.start, self.offsets, self.rows)

    def _draft(self) -> None:
        self.block[:1].copy_(self.ids[:1])
        self.ids[1:].copy_(self.drafter.draft_block(self.block, self._span()))

    def _verify(self) -> None:
        self.logits, self.feats = self.target(self.ids, self.state, logits="all", taps=self.engine.taps,
                                              speculative=True, span=self._span())

    def _decode(self) -> None:
        span = Span.fixed(self.start, self.offsets[:1], self.rows)
        self.logits, _ = self.target(self.ids[:1], self.state, logits="all", span=span)

    def _accept(self) -> None:
        out = accept(self.logits, self.ids[1:], self.params, self.draws, self.remaining, self.stop_ids)
        self.result.copy_(out)

    def _commit(self) -> None:
        n = self.result[self.B]
        if self.drafter is not None:
            self.target.commit(self.state, n)
            if self.feats is not None:
                self.drafter.store_context(self.feats, self._span().pos)
        self.ids[:1].copy_(self.result.index_select(0, n - 1))
        self.start.add_(n)
        self.remaining.sub_(n)

    # -- graphs ------------------------------------------------------------------------
    def _entry_points(self) -> dict:
        first = {"decode": self._decode} if self.drafter is None else {"draft": self._draft, "verify": self._verify}
        return {**first, self._accept_key(): self._accept, "commit": self._commit}

    def _capture_all(self) -> None:
        """Warm every entry point up in step order, then capture each. Nothing runs during a capture, so
        every capture reads buffers that hold real values (accept and commit read verify's outputs)."""
        self.remaining.fill_(self.B)
        steps = self._entry_points()
        self._warm_up(*steps.values())
        self.graphs = {name: self._capture(fn) for name, fn in steps.items()}

    def _warm_up(self, *fns) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # first-use checks, Triton compiles, allocator warm-up
                for fn in fns:
                    fn()
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def _capture(self, fn) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph

    def _accept_key(self) -> tuple:
        p = self.params
        return ("accept",) if p.greedy else ("accept", p.temperature, p.top_k, p.top_p)

    def _run(self, name) -> None:
        graph = self.graphs.get(name) if self.graphs is not None else None
        if graph is not None:
            graph.replay()
            return
        if self.graphs is not None and isinstance(name, tuple):  # a sampling setting seen for the first time
            try:
                self._warm_up(self._accept)  # accept is pure: warming it up changes nothing
                self.graphs[name] = self._capture(self._accept)
                self.graphs[name].replay()
                return
            except Exception as exc:  # noqa: BLE001
                warnings.warn(f"CUDA graph capture failed ({type(exc).__name__}: {exc}); decoding without graphs")
                self.graphs = None
        {"draft": self._draft, "verify": self._verify, "decode": self._decode, "commit": self._commit}.get(
            name, self._accept)()

    # -- one answer ----------------------------------------------------------------------
    def begin(self, last: int, params: SamplingParams, generator: torch.Generator) -> None:
        """Start decoding after a prefill: the state holds engine.tokens, `last` is the newest token."""
        stops = list(params.stop_token_ids)[:MAX_STOPS]
        self.stop_ids.fill_(-1)
        if stops:
            self.stop_ids[: len(stops)].copy_(torch.tensor(stops, dtype=torch.long), non_blocking=True)
        self.start.fill_(len(self.engine.tokens))
        self.ids[:1].fill_(last)
        self.params, self.generator = params, generator
        if not params.greedy and self.draws is None:
            self.draws = Draws.empty(self.B, self.target.cfg.vocab_size, self.device)
        self.last = last
        self.pending = []
        if self.drafter is not None:
            self._timed("draft", "draft")

    def _timed(self, kind: str, name) -> None:
        begin = _mark(self.device)
        self._run(name)
        self.pending.append((kind, begin, _mark(self.device)))

    def step(self, remaining: int) -> Step:
        """One decode step; `remaining` (>= 1) new tokens may still come."""
        issued = time.perf_counter()
        self.remaining.fill_(remaining)
        if not self.params.greedy:
            self.draws.fill(self.generator)
        if self.drafter is None:
            self._timed("verify", "decode")
        else:
            self._timed("verify", "verify")
        self._timed("verify", self._accept_key())
        self._timed("verify", "commit")
        self.host.copy_(self.result, non_blocking=True)
        ready = torch.cuda.Event() if self.device.type == "cuda" else None
        if ready is not None:
            ready.record()
        if self.drafter is not None:
            self._timed("draft", "draft")  # the next step's draft, queued before the read
        self.host_s += time.perf_counter() - issued
        if ready is not None:
            ready.synchronize()
        read = time.perf_counter()
        out = self.host.tolist()
        n, accepted = out[self.B], out[self.B + 1]
        emitted = out[:n]
        self.engine.committed(self.last, emitted)
        self.state.length += n
        self.last = emitted[-1]
        draft_s, verify_s = self._count(wait=False)
        drafted = min(self.B - 1, remaining - 1)
        self.host_s += time.perf_counter() - read
        return Step(emitted, drafted, min(accepted, drafted), draft_s, verify_s)

    def _count(self, wait: bool) -> tuple[float, float]:
        """(draft, verify) seconds of the intervals that have ended (all of them when `wait`)."""
        totals = {"draft": 0.0, "verify": 0.0}
        left = []
        for kind, begin, end in self.pending:
            if isinstance(end, float) or wait or end.query():
                if not isinstance(end, float):
                    end.synchronize()
                totals[kind] += _seconds(begin, end)
            else:
                left.append((kind, begin, end))
        self.pending = left
        return totals["draft"], totals["verify"]

    def finish(self) -> tuple[float, float]:
        """The time not yet counted, once the queued work is done (the last, unused draft is dropped)."""
        if self.drafter is not None and self.pending and self.pending[-1][0] == "draft":
            self.pending.pop()
        return self._count(wait=True)
