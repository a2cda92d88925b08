"""The generation loop: prefill -> draft -> verify -> accept -> commit, as a stream of events.

With a drafter (DFlash), each step verifies [last, d1..dk] in one target forward, keeps the accepted
prefix plus the target's own next token, and commits the target state to the kept length (see
state.py). k is the draft setting's: a fixed number, none ("off"), or chosen per step by `auto` (see
draft_length.py). With no drafter the same loop decodes one token per step: the baseline every
speedup is measured against. The steps themselves (steps/) have fixed shapes and are captured as CUDA
graphs on a GPU; `decode` chooses: "auto" (graphs on CUDA), "graphs", or "fixed" (the same steps
uncaptured; "eager" is an older name for it). This module keeps the loop, prefix reuse, timing and
the statistics.

The engine remembers which tokens its state holds: a prompt that starts with them (the next chat
turn) prefills only the new suffix. A prompt that shares only part of them (a branch: the same system
prompt and tools with another user message, a regenerated answer, an edited tail) resumes from the
nearest checkpoint at or before the point where they differ (engine/prefix_cache.py): each prefill saves
the state that cannot be truncated (GDN state, the drafter's sliding rings) at the end of the system
block (the caller's `marks`), every `checkpoint_every` tokens and at the prompt's end (with the last
logits: the same prompt again needs no forward). Attention-only targets truncate to the shared prefix
(from a little earlier when the drafter's rings must be refilled).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Iterator, Protocol

import torch

from dflash_chat.engine.draft_length import AutoDraft, Costs, DraftMemory, parse_draft, verify_sizes
from dflash_chat.engine.errors import ContextLengthError
from dflash_chat.engine.events import Event, Finished, GenerationStats, Prefilled, Step
from dflash_chat.engine.memory import PREFILL_CHUNK
from dflash_chat.engine.models.target import TargetModel
from dflash_chat.engine.prefix_cache import CHECKPOINT_EVERY, DEFAULT_BUDGET, Checkpoint, CheckpointCache
from dflash_chat.engine.sampling import Draws, first_token, noise_columns
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.steps import Clock, Steps

DECODE_MODES = ("auto", "graphs", "fixed", "eager")
COST_ROUNDS = 4  # timed warm-up rounds of every verify size (the first is not counted; the fastest of the rest is)


class Drafter(Protocol):
    block_size: int
    target_layer_ids: list[int]
    ctx_len: int  # committed positions whose context it holds

    def allocate(self, max_context: int) -> None: ...
    def truncate(self, length: int) -> None: ...
    def append_context(self, features: torch.Tensor, start: int) -> None:
        """Take the target features [n, K*H] of the newly committed positions start-n .. start-1."""

    def block_ids(self, device: torch.device) -> torch.Tensor:
        """The drafting block's input ids [B]; row 0 receives the last token."""

    def propose(
        self,
        ids: torch.Tensor,
        span,
        params: SamplingParams,
        draws: Draws | None,
        q_out: torch.Tensor | None,
        drafts: int | None = None,
    ) -> torch.Tensor:
        """The first `drafts` drafts (all B-1 by default) after ids[0] at the device positions `span`, reading
        no host value: greedy, or drawn from a proposal distribution that it writes to q_out [drafts, V] for
        the exact verify. The first k are the same whatever `drafts` >= k is."""

    def store_context(self, features: torch.Tensor, positions: torch.Tensor) -> None:
        """Context from the target features [n, K*H] at device positions [n]."""

    @property
    def ring_windows(self) -> list[int]:
        """The windows of the layers that keep their context in a ring (engine/models/dflash.py)."""

    def save_rings(self) -> list: ...
    def restore_rings(self, saved: list, length: int) -> None: ...


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode_mode(requested: str, device: torch.device) -> str:
    """The decode path for a device: "auto" is graphs on CUDA and uncaptured fixed steps elsewhere."""
    if requested not in DECODE_MODES:
        raise ValueError(f"decode must be one of {', '.join(DECODE_MODES[:3])}, not {requested!r}")
    if requested == "auto":
        return "graphs" if device.type == "cuda" else "fixed"
    if requested == "graphs" and device.type != "cuda":
        return "fixed"  # CUDA graphs need a CUDA device; the same fixed-shape steps run uncaptured
    return "fixed" if requested == "eager" else requested


class Engine:
    def __init__(
        self,
        target: TargetModel,
        drafter: Drafter | None = None,
        *,
        max_context: int = 4096,
        decode: str = "auto",
        draft: str | int = "auto",
        end_ids: tuple[int, ...] = (),
        checkpoint_budget: int = DEFAULT_BUDGET,
        checkpoint_every: int = CHECKPOINT_EVERY,
    ):
        """`end_ids`: the model's own end-of-turn ids; every answer stops at them (and at its params').
        `checkpoint_budget`: bytes of prompt checkpoints kept for branches (0: none but the last prompt's);
        `checkpoint_every`: tokens between two of them along a prompt (engine/prefix_cache.py)."""
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be at least 1 token, not {checkpoint_every}")
        self.checkpoints = CheckpointCache(checkpoint_budget)
        self.checkpoint_every = checkpoint_every
        self.target = target
        self.end_ids = tuple(end_ids)
        self.drafter = drafter
        self.max_context = max_context
        self.block_size = drafter.block_size if drafter else 1
        self.taps = list(drafter.target_layer_ids) if drafter and drafter.target_layer_ids else None
        self.device = target.model.norm.weight.device
        # a verify writes up to B-1 positions past the last committed one
        self.state = target.new_state(max_context + self.block_size, block=self.block_size)
        if drafter:
            drafter.allocate(max_context + self.block_size)
        self.tokens: list[int] = []  # exactly the tokens the target state (and the drafter's context) holds
        self.snapshot: Checkpoint | None = None  # the end of the last prompt, with its logits
        self.clock = Clock(self.device)
        self.decode = decode_mode(decode, self.device)
        self.set_draft(draft)

    def set_draft(self, draft: str | int) -> None:
        """The draft setting: "auto", "off" or a number of drafts per step (capped at the block's B-1).
        The steps are rebuilt (and captured again on CUDA) for the verify sizes it uses; the state is reset."""
        draft = parse_draft(draft)
        if getattr(self, "draft", None) == draft:
            return
        self.draft = draft
        self.sizes = verify_sizes(self.draft, self.block_size)
        self.steps = Steps(
            self.target, self.drafter, self.state, taps=self.taps, sizes=self.sizes, graphs=self.decode == "graphs"
        )
        self.decode = "graphs" if self.steps.graphs is not None else "fixed"
        self.costs: Costs | None = None  # auto's step costs, measured before its first answer
        self.reset()

    def warm_up(self) -> None:
        """Measure what `auto` needs (a step of each verify size) now, not before the first answer; resets."""
        if self.costs is None and len(self.sizes) > 1:
            self.costs = self._measure_costs()

    def _measure_costs(self) -> Costs:
        """Seconds of a step of each verify size (and of a draft), run on an empty state; the state is reset."""
        steps, clock = self.steps, Clock(self.device)
        for _ in range(COST_ROUNDS):  # every size in each round: a busy moment on the machine hits them alike
            for T in self.sizes:
                steps.begin(0, 0, SamplingParams(), None)
                if T > 1:
                    clock.timed("draft", T, steps.draft, T)
                clock.timed("verify", T, self._verify, T, self.block_size)
                steps.read()
                steps.rewind()
        seconds: dict[tuple[str, int], list[float]] = {}
        for interval, sec in clock.ended(wait=True):
            seconds.setdefault((interval.kind, interval.size), []).append(sec)
        best = {key: min(values[1:] or values) for key, values in seconds.items()}  # the first warms up
        self.reset()
        return Costs({T: best["verify", T] for T in self.sizes}, {T: best["draft", T] for T in self.sizes if T > 1})

    # -- state bookkeeping --------------------------------------------------------
    def reset(self) -> None:
        self.state.reset()
        if self.drafter:
            self.drafter.truncate(0)
        self.tokens = []
        self.snapshot = None
        self.checkpoints.clear()

    def _checkpoint(self, logits: torch.Tensor | None = None, marked: bool = False) -> Checkpoint:
        """What a prefill of the tokens held so far leaves that truncating the caches cannot bring back."""
        rings = self.drafter.save_rings() if self.drafter else []
        return Checkpoint(len(self.tokens), self.state.save_recurrent(), rings, logits, marked)

    def _keep_checkpoint(self, marked: bool) -> None:
        """A checkpoint of the tokens held so far into the cache; none, and the cache emptied, when the device has
        no room for one (the budget is the user's: the model's own memory comes first)."""
        try:
            self.checkpoints.add(self._checkpoint(marked=marked))
        except torch.OutOfMemoryError:
            self.checkpoints.clear()

    def _needs_checkpoints(self) -> bool:
        """Whether truncating alone loses something: GDN state, or a drafter's rings."""
        return bool(self.state.gdn_layers() or (self.drafter and self.drafter.ring_windows))

    def _restore(self, checkpoint: Checkpoint) -> None:
        length = checkpoint.length
        self.state.load_recurrent(checkpoint.recurrent, length)
        self.tokens = self.tokens[:length]
        if self.drafter:
            self.drafter.truncate(length)
            self.drafter.restore_rings(checkpoint.rings, length)
        self._forget_past(length)

    def _forget_past(self, length: int) -> None:
        """The rows past `length` are about to be overwritten: the checkpoints past it no longer hold."""
        self.checkpoints.drop_past(length)
        if self.snapshot is not None and self.snapshot.length > length:
            self.snapshot = None

    def _truncate_attention_only(self, length: int) -> None:
        """Attention-only targets roll back to any length: drop committed positions >= length."""
        self._forget_past(length)
        if self.drafter:
            self.drafter.truncate(length)
        self.state.length = length
        self.tokens = self.tokens[:length]

    def _rings_stale(self, length: int) -> int:
        """How far before `length` a truncation to it must refill the drafter's rings (0: they still hold the
        window before it). A ring of window w has room for w + B rows: once the held tokens pass w, the rows
        of the positions a window before any shorter length were overwritten by later ones."""
        held = len(self.tokens)
        windows = self.drafter.ring_windows if self.drafter else []
        if length >= held or not windows or held <= min(windows):
            return 0
        return max(windows)

    def _reuse(self, prompt: list[int]) -> tuple[int, torch.Tensor | None]:
        """Bring the state to the longest reusable prefix of `prompt`: (reused tokens, logits if complete)."""
        common = 0
        for a, b in zip(self.tokens, prompt, strict=False):
            if a != b:
                break
            common += 1
        if common == len(self.tokens) and common < len(prompt):
            return common, None
        whole = len(prompt)
        # every checkpoint is a prefix of the held tokens: those within the common prefix serve this prompt
        best = self.checkpoints.best(min(common, whole), with_logits_at=whole)
        snap = self.snapshot
        if snap is not None and snap.length <= min(common, whole) and (best is None or snap.length > best.length):
            best = snap
        if not self.state.gdn_layers():
            keep = min(common, whole - 1)  # attention-only: any length truncates
            refill = self._rings_stale(keep)
            if best is None or best.length < keep - refill or (best.length < keep and not refill):
                keep = max(0, keep - refill)
                self._truncate_attention_only(keep)
                return keep, None
        if best is None:
            self.reset()
            return 0, None
        self._restore(best)
        return best.length, (best.logits if best.length == whole else None)

    def _marks(self, prompt: list[int], reused: int, marks: Sequence[int]) -> dict[int, bool]:
        """Where this prefill saves checkpoints: position -> marked (the caller's marks, every
        `checkpoint_every` tokens), strictly inside the part it runs."""
        if not self.checkpoints.budget or not self._needs_checkpoints():
            return {}
        every = self.checkpoint_every
        at = {p: False for p in range((reused // every + 1) * every, len(prompt), every)}
        at.update({int(p): True for p in marks if reused < int(p) < len(prompt)})
        return at

    # -- generation ---------------------------------------------------------------
    def stop_ids(self, params: SamplingParams) -> tuple[int, ...]:
        """The ids an answer with `params` stops at: the model's end-of-turn ids and the params' own."""
        return tuple(sorted(set(self.end_ids) | set(params.stop_token_ids)))

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        cancel: threading.Event | None = None,
        *,
        memory: DraftMemory | None = None,
        marks: Sequence[int] = (),
    ) -> Iterator[Event]:
        """Answer `prompt_ids`. `memory`: what `auto` has learned of the conversation this answer belongs to
        (draft_length.py), which it goes on learning; without one, the answer starts from the fixed priors.
        `marks`: prompt positions where later prompts are likely to branch (the end of the system block):
        the prefill keeps a checkpoint there (engine/prefix_cache.py)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt is empty")
        asked = params.max_new_tokens
        if len(prompt) + (asked or 1) > self.max_context:
            raise ContextLengthError(
                f"prompt ({len(prompt)} tokens) + max new tokens ({asked or 1}) exceed the "
                f"{self.max_context}-token context: shorten the chat, lower max new tokens or raise the context length"
            )
        generator = torch.Generator(self.device)
        generator.manual_seed(params.seed if params.seed is not None else int(time.time_ns() % (2**63)))
        stats = GenerationStats(
            prompt_tokens=len(prompt),
            speculative=self.drafter is not None,
            draft=str(self.draft) if self.drafter is not None else "off",
        )
        stats.acceptance_histogram = [0] * self.block_size
        stats.draft_histogram = [0] * self.block_size
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.warm_up()
        t0 = time.perf_counter()
        try:
            limit = asked or self.max_context - len(prompt)
            yield from self._generate(
                prompt, params, cancel, generator, stats, t0, memory or DraftMemory(), limit, marks
            )
        except torch.OutOfMemoryError:
            self.reset()
            stats.peak_memory_bytes = self._peak_memory()
            yield Finished(
                "error", stats, "out of GPU memory: use a shorter context, a smaller quant or a smaller model"
            )

    def _prefill(self, prompt: list[int], stats: GenerationStats, marks: Sequence[int] = ()) -> torch.Tensor:
        reused, logits = self._reuse(prompt)
        stats.reused_tokens = reused
        if logits is None:
            saves = self._marks(prompt, reused, marks)
            stops = sorted(saves)
            begin = reused
            while begin < len(prompt):
                # in chunks (attention masks and context features stay small), cut at each checkpoint
                end = min([begin + PREFILL_CHUNK, len(prompt), *(p for p in stops if p > begin)])
                chunk = prompt[begin:end]
                logits = self.steps.prefill(chunk, final=end == len(prompt))
                self.tokens.extend(chunk)
                if end in saves:
                    self._keep_checkpoint(saves[end])
                begin = end
            assert logits is not None, "the last chunk is final: it has logits"
            old, self.snapshot = self.snapshot, self._checkpoint(logits)
            if old is not None and old.length < len(self.tokens) and self.checkpoints.budget:
                self.checkpoints.add(old)  # the last prompt's end: where an edit of what followed resumes
        return logits

    def _generate(self, prompt, params, cancel, generator, stats, t0, memory, limit, marks) -> Iterator[Event]:
        logits = self._prefill(prompt, stats, marks)
        _sync(self.device)
        stats.prefill_s = time.perf_counter() - t0
        yield Prefilled(len(prompt), stats.reused_tokens, stats.prefill_s)

        V = self.target.cfg.vocab_size
        draws = None if params.greedy else Draws.empty(1, V, self.device).fill(generator, 1, noise_columns(params, V))
        stops = self.stop_ids(params)
        last = int(first_token(logits, params, draws).item())
        stats.ttft_s = time.perf_counter() - t0
        stats.new_tokens = 1
        yield Step([last], 0, 0, 0.0, 0.0)
        if last in stops:
            yield self._finish("stop", stats)
            return
        decode_t0 = time.perf_counter()
        acceptance = memory.estimate(params.greedy, max(self.block_size - 1, 0))
        auto = AutoDraft(self.sizes, acceptance, self.costs) if self.costs is not None else None

        def finish(reason: str) -> Finished:
            spacing = acceptance.probe_every if auto else None  # fixed drafts never space tries
            return self._finish_decode(reason, stats, decode_t0, memory, params.greedy, spacing)

        steps, clock = self.steps, self.clock
        steps.begin(last, len(self.tokens), params, generator, stops)
        T = auto.choose() if auto else self.sizes[-1]
        if T > 1:
            clock.timed("draft", T, steps.draft, T)
        while True:
            if cancel is not None and cancel.is_set():
                yield finish("cancelled")
                return
            remaining = limit - stats.new_tokens
            if remaining <= 0:
                yield finish("length")
                return
            clock.timed("verify", T, self._verify, T, remaining)
            ended = clock.ended()  # before the next draft is queued: it belongs to the next step
            following = auto.choose() if auto else T
            if following > 1:
                clock.timed("draft", following, steps.draft, following)  # queued before the read
            out = steps.read()
            self.tokens.append(last)
            self.tokens.extend(out.tokens[:-1])
            if T > 1:
                acceptance.observe(T - 1, out.accepted)
            draft_s, verify_s = self._count(ended, stats)
            drafted = min(T - 1, remaining - 1)
            step = Step(out.tokens, drafted, min(out.accepted, drafted), draft_s, verify_s)
            stats.steps += 1
            stats.new_tokens += len(step.token_ids)
            stats.drafted += step.drafted
            stats.accepted += step.accepted
            stats.draft_histogram[step.drafted] += 1
            if step.drafted:
                stats.acceptance_histogram[step.accepted] += 1
            yield step
            last = out.tokens[-1]
            if last in stops:
                yield finish("stop")
                return
            T = following

    def _verify(self, T: int, remaining: int) -> None:
        self.steps.verify(T, remaining)
        self.steps.commit(T)

    def _count(self, ended, stats: GenerationStats) -> tuple[float, float]:
        """(draft, verify) seconds of intervals that ended, added to the stats and to auto's costs."""
        totals = {"draft": 0.0, "verify": 0.0}
        for interval, seconds in ended:
            totals[interval.kind] += seconds
            if self.costs is not None:
                self.costs.observe(interval.kind, interval.size, seconds)
        stats.draft_s += totals["draft"]
        stats.verify_s += totals["verify"]
        return totals["draft"], totals["verify"]

    def _peak_memory(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        try:
            import resource
        except ImportError:  # Windows
            return 0
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def _finish_decode(
        self,
        reason: str,
        stats: GenerationStats,
        decode_t0: float,
        memory: DraftMemory,
        greedy: bool,
        spacing: int | None,
    ) -> Finished:
        """End after decoding: the queued work is waited for and counted (the last, unused draft is not); the
        drafter holds the context of every committed token; the decoding's record learns the answer."""
        self.steps.flush_context()
        self.clock.drop_last("draft")
        self._count(self.clock.ended(wait=True), stats)
        stats.decode_s = time.perf_counter() - decode_t0
        memory.learn(greedy, stats.acceptance_histogram, spacing)
        return self._finish(reason, stats)

    def _finish(self, reason: str, stats: GenerationStats) -> Finished:
        stats.peak_memory_bytes = self._peak_memory()
        return Finished(reason, stats)
