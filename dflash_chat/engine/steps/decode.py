"""`Steps`: the fixed-shape decode steps (see the package docstring), captured per size on CUDA."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dflash_chat.engine.images import ChunkInput
from dflash_chat.engine.models.span import Span
from dflash_chat.engine.sampling import Draws, Guide, accept, noise_columns
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.structured import apply as apply_mask

MAX_STOPS = 16  # stop ids a step checks on the device (the chat templates use 2-3)
DEFERRED_ROWS = 64  # plain steps whose drafter context an uncaptured step stores at once
_WARM_REMAINING = 1 << 30  # tokens left while warming up: no step is cut short


@dataclass(frozen=True)
class Entry:
    """One entry point of a step, as it is captured: `run` (Steps._draft, _verify, _accept or _commit) for
    verify size T. Draft and accept read the sampling settings, which a graph bakes in, so theirs are part of
    what tells two captures apart; they are also pure (they write only their own outputs), so warming one up
    for a new setting mid-answer changes nothing."""

    run: Callable[[Steps, int], None]
    T: int
    sampling: tuple = ()

    @property
    def pure(self) -> bool:
        return self.run in (Steps._draft, Steps._draft_mtp, Steps._accept)

    def __call__(self, steps: Steps) -> None:
        self.run(steps, self.T)


@dataclass(frozen=True)
class StepResult:
    tokens: list[int]  # the n tokens the step emitted
    accepted: int  # drafts the verify accepted (before the cut at a stop token or the tokens left)


class Steps:
    def __init__(
        self,
        target,
        drafter,
        state,
        *,
        taps: list[int] | None,
        sizes: list[int],
        graphs: bool,
        mtp=None,
        drafts: dict[str, list[int]] | None = None,
        width: int | None = None,
    ):
        """`sizes`: the verify sizes T in use (1 is a plain decode step); `drafts`: the model drafts' sizes T in
        use per method ("dflash", "mtp"; default: the DFlash drafter's at every size but 1); `width`: the most
        tokens a verify takes (default: the drafter's block). `taps`: the target layers whose output the DFlash
        drafter reads, then, with an MTP layer, the last one (the MTP layer's hidden state)."""
        self.target, self.drafter, self.mtp, self.state, self.taps = target, drafter, mtp, state, taps
        self.device = dev = target.model.norm.weight.device
        self.B = width or (drafter.block_size if drafter else 1)
        self.sizes = sorted(set(sizes))
        if self.sizes[0] < 1 or self.sizes[-1] > self.B:
            raise ValueError(f"verify sizes must be within 1..{self.B}, not {self.sizes}")
        default = {"dflash": [T for T in self.sizes if T > 1]} if drafter is not None else {}
        self.drafts = {method: sorted(set(Ts)) for method, Ts in (default if drafts is None else drafts).items()}
        # the DFlash drafter's part of the tapped features; the MTP layer's is the last H columns
        self.dflash_width = len(drafter.target_layer_ids) * target.cfg.hidden_size if drafter is not None else 0
        self.rows = state.max_len  # cache rows a captured step's reference path reads
        long = dict(dtype=torch.long, device=dev)
        self.start = torch.zeros((), **long)  # committed length
        self.delta = torch.zeros((), **long)  # the prompt's M-RoPE offset: a token at n rotates at n + delta
        self.shifted = False  # the answer's delta is not 0 (uncaptured steps skip adding a 0 offset)
        self.remaining = torch.zeros((), **long)  # tokens the answer may still emit
        self.stop_ids = torch.full((MAX_STOPS,), -1, **long)
        self.offsets = torch.arange(max(self.B, drafter.block_size if drafter else 1), **long)
        self.block = drafter.block_ids(dev) if drafter else None  # the drafter's input
        self.drafter_columns = getattr(drafter, "draft_noise_columns", None)  # draft noise it reads (None: q's)
        self.columns: int | None = None  # noise columns the verify's draws read (None: all)
        self.draft_columns: int | None = None  # and the DFlash drafts'
        self.ids = torch.zeros(self.B, **long)  # the verify input: [last, drafts]
        self.proposed = torch.zeros(self.B, dtype=torch.long, pin_memory=dev.type == "cuda")  # lookup's, on the host
        self.result = torch.zeros(self.B + 2, **long)  # [tokens (first T), ..., n, accepted]
        self.host = torch.zeros(self.B + 2, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.ready: torch.cuda.Event | None = None  # the event after the result's copy to the host (CUDA)
        self.outputs: dict[int, tuple] = {}  # T -> (logits, feats) of the last verify of that size
        self.q: torch.Tensor | None = None  # [B-1, V]: the drafts' processed distributions (sampling)
        self.draws: Draws | None = None
        self.params = SamplingParams()
        self.masked = False  # the answer is held to a grammar: the verify reads `bitmask`
        self.bitmask: torch.Tensor | None = None  # [B, words]: the allowed tokens of each verify row
        self.guide: Guide | None = None  # the draft being drawn is held to a grammar (`draft`)
        self.generator: torch.Generator | None = None
        self.length = 0  # committed positions, on the host (known after each read)
        self.host_s = 0.0  # host time in the decode entry points: issuing them and reading results (not the wait)
        # plain steps' (features, positions, rotary positions, token ids) whose context is not stored yet
        self.deferred: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = []
        self.graphs: dict | None = None
        self.static = graphs  # captured steps read every cache row on a reference path (no host length)
        if graphs:
            try:
                self._capture_all()
            except Exception as exc:  # noqa: BLE001 - any failure means: run the same steps uncaptured
                warnings.warn(
                    f"CUDA graph capture failed ({type(exc).__name__}: {exc}); decoding without graphs", stacklevel=2
                )
                self.graphs = None
                self.static = False
                torch.cuda.synchronize(dev)

    # -- prefill (variable shapes, positions on the host) ------------------------------
    @torch.no_grad()
    def prefill(self, ids: list[int], final: bool, images: ChunkInput | None = None) -> torch.Tensor | None:
        """Run prompt tokens at the state's length; the drafter gets their context. Logits of the last when final.
        `images`: the part of a prompt with images these tokens are (their embeddings and M-RoPE positions)."""
        tensor = torch.tensor(ids, dtype=torch.long, device=self.device)
        embeds, rope = (images.embeds, images.rope) if images is not None else (None, None)
        logits, feats = self.target(
            tensor, self.state, logits="last" if final else None, taps=self.taps, embeds=embeds, rope_positions=rope
        )
        if feats is None:  # nothing reads the target's features (a drafter that needs none)
            return logits
        if self.dflash_width:
            temporal = None if rope is None else rope[0]  # the drafter's plain RoPE reads the temporal positions
            self.drafter.append_context(feats[:, : self.dflash_width], self.state.length, temporal)
        if self.mtp is not None:
            rows = None if images is None else images.pair_rope
            self.mtp.append_context(feats[:, self.dflash_width :], tensor, self.state.length - len(ids), embeds, rows)
        return logits

    # -- the entry points (fixed shapes, no host reads) ------------------------------
    def _span(self, T: int) -> Span:
        """T positions from the device's committed length. Uncaptured steps read only the cache rows that can
        be in use: the host's length may lag by one step's tokens (<= B), as a draft is queued before the
        read of the step it follows; rows past the device's length are masked."""
        return Span.fixed(self.start, self.offsets[:T], self._bound(T), self._shift())

    def _shift(self) -> torch.Tensor | None:
        """The rotary's offset from the positions: the device delta in a captured step (one graph serves every
        answer); uncaptured, none where the answer's delta is 0."""
        return self.delta if self.static or self.shifted else None

    def _bound(self, T: int) -> int:
        return self.rows if self.static else min(self.rows, self.length + len(self.offsets) + T)

    def _draft(self, T: int) -> None:
        """The DFlash drafts a verify of T reads (ids[1:T]; on the CPU the LM head's rows are much of a draft's
        cost)."""
        assert self.block is not None, "a target without a drafter has no draft step"
        self.flush_context()
        self.block[:1].copy_(self.ids[:1])
        span = self._span(self.drafter.block_size)
        drafts = self.drafter.propose(self.block, span, self.params, self.draws, self.q, T - 1, self.guide)
        self.ids[1:T].copy_(drafts)

    def _draft_mtp(self, T: int) -> None:
        """The T - 1 drafts of the target's MTP layer chained from the newest committed position (ids[1:T])."""
        assert self.mtp is not None, "a target without an MTP layer has no MTP draft step"
        self.flush_context()
        drafts = self.mtp.propose(
            self.ids[:1], self.start, self._bound(T), self.params, self.draws, self.q, T - 1, self._shift(), self.guide
        )
        self.ids[1:T].copy_(drafts)

    def _verify(self, T: int) -> None:
        self.outputs[T] = self.target(
            self.ids[:T], self.state, logits="all", taps=self.taps, speculative=T > 1, span=self._span(T)
        )

    def _accept(self, T: int) -> None:
        logits = self.outputs[T][0]
        if self.masked:
            assert self.bitmask is not None, "a masked answer has its bitmask"
            logits = apply_mask(logits, self.bitmask[:T])
        out = accept(logits, self.ids[1:T], self.params, self.draws, self.remaining, self.stop_ids, self.q)
        self.result[:T].copy_(out[:T])
        self.result[self.B :].copy_(out[T:])

    def _commit(self, T: int) -> None:
        n = self.result[self.B]
        feats = self.outputs[T][1]
        if T > 1:
            self.target.commit(self.state, n)
        if feats is not None:
            span = self._span(T)
            self._store_context(feats, span.pos, span.rotated, self.ids[:T], n, defer=T == 1 and not self.static)
        self.ids[:1].copy_(self.result.index_select(0, n - 1))
        self.start.add_(n)
        self.remaining.sub_(n)

    def _store_context(
        self,
        feats: torch.Tensor,
        positions: torch.Tensor,
        rope: torch.Tensor,
        ids: torch.Tensor,
        n: torch.Tensor,
        defer: bool,
    ) -> None:
        """The drafting models' context of a verify of ids [T] whose first n rows were kept. A plain step's,
        uncaptured, waits for the next draft (or the end of the answer) and is stored with the others in one
        call: a run of plain steps pays for the context projections once, not per token."""
        if defer:
            self.deferred.append((feats, positions, rope, ids.clone()))
            if len(self.deferred) < DEFERRED_ROWS:
                return
        self.flush_context()
        if not defer:
            self._store(feats, positions, rope, ids, n - 1)

    def _store(
        self, feats: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor, ids: torch.Tensor, newest
    ) -> None:
        if self.dflash_width:
            self.drafter.store_context(feats[:, : self.dflash_width], positions, rope)
        if self.mtp is not None:
            self.mtp.commit_context(feats[:, self.dflash_width :], ids, positions, newest, rope)

    @torch.no_grad()
    def flush_context(self) -> None:
        """Store the deferred plain steps' context (each kept its one row: the rows are consecutive)."""
        if self.deferred:
            feats, positions, rope, ids = (torch.cat(part) for part in zip(*self.deferred, strict=True))
            self.deferred = []
            self._store(feats, positions, rope, ids, torch.tensor(feats.shape[0] - 1, device=feats.device))

    # -- graphs ------------------------------------------------------------------------
    def _sampling(self) -> tuple:
        """The sampling settings a graph of draft or accept bakes in."""
        p = self.params
        return () if p.greedy else (p.temperature, p.top_k, p.top_p, p.min_p)

    def _entries(self, T: int) -> list[Entry]:
        """A step of size T in order: its model drafts (each method's that drafts at T), verify, accept, commit."""
        sampling = self._sampling()
        drafts = [Entry(DRAFT_STEPS[method], T, sampling) for method, Ts in self.drafts.items() if T in Ts]
        return drafts + [Entry(Steps._verify, T), Entry(Steps._accept, T, self._accepting()), Entry(Steps._commit, T)]

    def _accepting(self) -> tuple:
        """What an accept's graph bakes in: the sampling settings, and whether a grammar's mask is read."""
        return self._sampling() + (("masked",) if self.masked else ())

    @torch.no_grad()
    def _capture_all(self) -> None:
        """Warm every size's entry points up in step order, then capture each. Nothing runs during a capture,
        so every capture reads buffers that hold real values (accept and commit read verify's outputs)."""
        self.remaining.fill_(_WARM_REMAINING)
        self.start.fill_(1)  # a committed token before the block: the MTP layer's first row sits at start - 1
        entries = list(dict.fromkeys(entry for T in self.sizes for entry in self._entries(T)))
        self._warm_up(entries)
        self.graphs = {entry: self._capture(entry) for entry in entries}
        self.rewind()

    def _warm_up(self, entries: list[Entry]) -> None:
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # first-use checks, Triton compiles, allocator warm-up
                for entry in entries:
                    entry(self)
        torch.cuda.current_stream(self.device).wait_stream(stream)

    def _capture(self, entry: Entry) -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            entry(self)
        return graph

    @torch.no_grad()  # a commit updates state from parameters: under autograd each would chain onto the last
    def _run(self, entry: Entry) -> None:
        graph = self.graphs.get(entry) if self.graphs is not None else None
        if graph is not None:
            graph.replay()
            return
        if self.graphs is not None and entry.pure:  # a sampling setting seen for the first time
            try:
                self._warm_up([entry])
                self.graphs[entry] = self._capture(entry)
                self.graphs[entry].replay()
                return
            except Exception as exc:  # noqa: BLE001 - any failure means: run the same steps uncaptured
                warnings.warn(
                    f"CUDA graph capture failed ({type(exc).__name__}: {exc}); decoding without graphs", stacklevel=2
                )
                self.graphs = None
                self.static = False
        entry(self)

    # -- one answer: the seam the loop drives ----------------------------------------------
    def begin(
        self,
        last: int,
        length: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        stop_ids: tuple[int, ...] = (),
        mask_words: int = 0,
        delta: int = 0,
    ) -> None:
        """Start decoding after a prefill: the state holds `length` tokens, `last` is the newest token, the answer
        ends at `stop_ids` (a greedy answer needs no generator). `mask_words` > 0: the answer is held to a grammar
        whose masks (`bitmask`, that many words a row) the loop writes before each verify. `delta`: the prompt's
        M-RoPE offset (engine/models/image_prompt.py; 0 without images): every model rotates a token at index n at
        n + delta."""
        stops = list(stop_ids)[:MAX_STOPS]
        self.stop_ids.fill_(-1)
        if stops:
            self.stop_ids[: len(stops)].copy_(torch.tensor(stops, dtype=torch.long), non_blocking=True)
        self.length = length
        self.start.fill_(length)
        self.delta.fill_(delta)
        self.shifted = delta != 0
        self.ids[:1].fill_(last)
        self.params, self.generator = params, generator
        self.masked = mask_words > 0
        if self.masked and (self.bitmask is None or self.bitmask.shape[1] != mask_words):
            self.bitmask = torch.full((self.B, mask_words), -1, dtype=torch.int32, device=self.device)
        self.columns = noise_columns(params, self.target.cfg.vocab_size)
        self.draft_columns = self.drafter_columns if self.drafter_columns is not None else self.columns
        if not params.greedy and self.draws is None:
            self.draws = Draws.empty(self.B, self.target.cfg.vocab_size, self.device)
            if self.B > 1:
                self.q = torch.zeros(self.B - 1, self.target.cfg.vocab_size, device=self.device)

    def draft(self, T: int, method: str = "dflash", guide: Guide | None = None) -> None:
        """Queue the T - 1 drafts of a model (`method` "dflash" or "mtp") after the last token that a verify of T
        reads. The first T - 1 are the same for every T: the DFlash drafter runs its whole block (its rows
        attend to each other), the MTP layer drafts one token after another. With a `guide` (a grammar holds
        the answer) the drafts are drawn held to it, reading each on the host: uncaptured, and its time is the
        grammar's, not the steps' host time."""
        issued = time.perf_counter()
        if not self.params.greedy:
            draws, generator = self._randomness()
            columns = self.draft_columns if method == "dflash" else self.columns
            draws.fill_drafts(generator, None if guide is not None else columns, T - 1)
        entry = Entry(DRAFT_STEPS[method], T, self._sampling())
        if guide is None:
            self._run(entry)
            self.host_s += time.perf_counter() - issued
            return
        self.guide = guide
        try:
            with torch.no_grad():
                entry(self)
        finally:
            self.guide = None

    def place(self, tokens: list[int]) -> None:
        """Fixed drafts from the host (prompt lookup's) for a verify of len(tokens) + 1: a deterministic
        proposal, whose q is one-hot (the exact rule then accepts a draft d with p(d))."""
        issued = time.perf_counter()
        k = len(tokens)
        self.proposed[:k] = torch.tensor(tokens, dtype=torch.long)
        self.ids[1 : k + 1].copy_(self.proposed[:k], non_blocking=True)
        if not self.params.greedy:
            assert self.q is not None, "sampled drafts need their q"
            self.q[:k].zero_().scatter_(1, self.ids[1 : k + 1, None], 1.0)
        self.host_s += time.perf_counter() - issued

    def verify(self, T: int, remaining: int, between: Callable[[], None] | None = None) -> None:
        """Verify [last, d1..d(T-1)]: the target's forward and the verify rule; `remaining` >= 1 tokens may come.
        `between` runs on the host once the forward is queued, before the rule is: a grammar's masks are
        computed there while the device runs the forward (its time is not counted as the steps' host time)."""
        issued = time.perf_counter()
        self.remaining.fill_(remaining)
        if not self.params.greedy:
            draws, generator = self._randomness()
            draws.fill(generator, T, self.columns)
        self._run(Entry(Steps._verify, T))
        self.host_s += time.perf_counter() - issued
        if between is not None:
            between()
        issued = time.perf_counter()
        self._run(Entry(Steps._accept, T, self._accepting()))
        self.host_s += time.perf_counter() - issued

    def _randomness(self) -> tuple[Draws, torch.Generator]:
        """A sampled step's draws and generator (`begin` sets them)."""
        assert self.draws is not None and self.generator is not None, "a sampled answer needs a generator"
        return self.draws, self.generator

    def commit(self, T: int) -> None:
        """Keep what the verify accepted and queue its result for the host."""
        issued = time.perf_counter()
        self._run(Entry(Steps._commit, T))
        self.host.copy_(self.result, non_blocking=True)
        if self.device.type == "cuda":
            self.ready = torch.cuda.Event()
            self.ready.record()
        self.host_s += time.perf_counter() - issued

    def read(self) -> StepResult:
        """The step's one host read: its tokens (the work queued after the commit goes on meanwhile)."""
        if self.ready is not None:
            self.ready.synchronize()
        issued = time.perf_counter()
        out = self.host.tolist()
        n, accepted = out[self.B], out[self.B + 1]
        self.length += n
        self.state.length = self.length
        if self.drafter is not None:
            self.drafter.ctx_len = self.length
        self.host_s += time.perf_counter() - issued
        return StepResult(out[:n], accepted)

    def rewind(self) -> None:
        """Back to an empty state after warm-up runs (the caller resets what the state holds; a drafting model's
        context past the committed length is rewritten before it is read)."""
        self.length = 0
        self.deferred = []
        self.start.zero_()
        self.delta.zero_()
        self.shifted = False
        self.state.reset()
        if self.drafter is not None:
            self.drafter.truncate(0)


DRAFT_STEPS = {"dflash": Steps._draft, "mtp": Steps._draft_mtp}  # method -> its draft entry point
