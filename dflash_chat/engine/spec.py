"""The generation loop: prefill -> draft -> verify -> accept -> roll back, as a stream of events.

With a drafter (DFlash), each step drafts D <= B-1 tokens after the last token, verifies
[last, d1..dD] in one target forward, keeps the accepted prefix plus the target's own next token, and
rolls the target state back to the kept length (see state.py for how GDN state is rolled back). With
no drafter the same loop decodes one token per step: the baseline every speedup is measured against.

Two ways to run the decode steps, with the same results: eager steps (variable shapes, positions as
host ints: the CPU default) and fixed-shape steps (fixed_steps.py: device-resident positions, always a
B-token verify, captured as CUDA graphs on a GPU). `decode` chooses: "auto" (graphs on CUDA, eager
elsewhere), "graphs", "fixed" (fixed shapes without capture) or "eager".

The engine remembers which tokens its state holds: a prompt that starts with them (the next chat
turn) prefills only the new suffix. At the end of each prefill it keeps a snapshot of the state
(recurrent state, last logits) so a prompt that diverges after that point (a regenerated answer, a
chat template that re-renders the last answer) restarts from the snapshot; attention-only targets
simply truncate to the shared prefix.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from dflash_chat.engine.errors import ContextLengthError
from dflash_chat.engine.events import Event, Finished, GenerationStats, Prefilled, Step
from dflash_chat.engine.memory import PREFILL_CHUNK
from dflash_chat.engine.models.target import TargetModel
from dflash_chat.engine.sampling import Draws, SamplingParams, accept, first_token

DECODE_MODES = ("auto", "graphs", "fixed", "eager")


class Drafter(Protocol):
    block_size: int
    target_layer_ids: list[int]
    ctx_len: int  # committed positions whose context it holds

    def allocate(self, max_context: int) -> None: ...
    def truncate(self, length: int) -> None: ...
    def append_context(self, features: torch.Tensor, start: int) -> None:
        """Take the target features [n, K*H] of the newly committed positions start-n .. start-1."""
    def propose(self, last_token: int, start: int, length: int) -> torch.Tensor:
        """The ids to verify, [last_token, d1..d_length], for positions start .. start+length."""
    # fixed-shape steps
    def block_ids(self, device: torch.device) -> torch.Tensor:
        """The drafting block's input ids [B]; row 0 receives the last token."""
    def draft_block(self, ids: torch.Tensor, span) -> torch.Tensor:
        """B-1 drafts after ids[0] at the device positions `span`, without reading a host value."""
    def store_context(self, features: torch.Tensor, positions: torch.Tensor) -> None:
        """Context from the target features [n, K*H] at device positions [n]."""


@dataclass
class _Snapshot:
    length: int
    logits: torch.Tensor
    recurrent: list


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Clock:
    """Marks on the device's timeline that cost no host wait: CUDA events, or perf_counter on the CPU.

    A CUDA interval can be read only once the stream has passed its end mark; the engine reads each
    step's intervals after the verify's copy of the accepted tokens, which is such a point.
    """

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.current_stream(device) if device.type == "cuda" else None

    def mark(self):
        if self.stream is None:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def seconds(self, begin, end) -> float:
        return begin.elapsed_time(end) / 1000 if self.stream is not None else end - begin

    def wait(self, mark) -> None:
        if self.stream is not None:
            mark.synchronize()


@dataclass
class _Tail:
    """The end of a step that runs after its tokens are known: rollback (verify time), then the
    drafter's new context (draft time). Read at the next step, or when generation ends."""

    verified: object
    rolled_back: object
    appended: object


def decode_mode(requested: str, device: torch.device) -> str:
    """The decode path for a device: "auto" is graphs on CUDA and eager steps elsewhere."""
    if requested not in DECODE_MODES:
        raise ValueError(f"decode must be one of {', '.join(DECODE_MODES)}, not {requested!r}")
    if requested == "auto":
        return "graphs" if device.type == "cuda" else "eager"
    if requested == "graphs" and device.type != "cuda":
        return "fixed"  # CUDA graphs need a CUDA device; the same fixed-shape steps run uncaptured
    return requested


class Engine:
    def __init__(self, target: TargetModel, drafter: Drafter | None = None, *, max_context: int = 4096,
                 decode: str = "auto"):
        self.target = target
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
        self.snapshot: _Snapshot | None = None
        self.clock = _Clock(self.device)
        self.tail: _Tail | None = None
        self.decode = decode_mode(decode, self.device)
        self.fixed = None
        if self.decode != "eager":
            from dflash_chat.engine.fixed_steps import FixedSteps

            self.fixed = FixedSteps(self, graphs=self.decode == "graphs")
            self.decode = "graphs" if self.fixed.graphs else "fixed"

    # -- state bookkeeping --------------------------------------------------------
    def reset(self) -> None:
        self.state.reset()
        if self.drafter:
            self.drafter.truncate(0)
        self.tokens = []
        self.snapshot = None

    def _take_snapshot(self, logits: torch.Tensor) -> None:
        self.snapshot = _Snapshot(len(self.tokens), logits, self.state.save_recurrent())

    def _restore_snapshot(self) -> torch.Tensor:
        snap = self.snapshot
        self.state.load_recurrent(snap.recurrent, snap.length)
        self.tokens = self.tokens[: snap.length]
        if self.drafter:
            self.drafter.truncate(snap.length)
        return snap.logits

    def _truncate_attention_only(self, length: int) -> None:
        """Attention-only targets roll back to any length: drop committed positions >= length."""
        if self.snapshot is not None and self.snapshot.length > length:
            self.snapshot = None
        if self.drafter:
            self.drafter.truncate(length)
        self.state.length = length
        self.tokens = self.tokens[:length]

    def _reuse(self, prompt: list[int]) -> tuple[int, torch.Tensor | None]:
        """Bring the state to the longest reusable prefix of `prompt`: (reused tokens, logits if complete)."""
        common = 0
        for a, b in zip(self.tokens, prompt):
            if a != b:
                break
            common += 1
        if common == len(self.tokens) and common < len(prompt):
            return common, None
        # attention-only targets can truncate to any length; the last prompt's snapshot serves when it
        # keeps at least as much (and it holds the logits when it is the whole prompt)
        keep = 0 if self.state.gdn_layers() else min(common, len(prompt) - 1)
        snap = self.snapshot
        if snap is not None and keep <= snap.length <= min(common, len(prompt)):
            logits = self._restore_snapshot()
            return snap.length, (logits if snap.length == len(prompt) else None)
        if keep:
            self._truncate_attention_only(keep)
            return keep, None
        self.reset()
        return 0, None

    # -- generation ---------------------------------------------------------------
    def generate(
        self, prompt_ids: list[int], params: SamplingParams, cancel: threading.Event | None = None
    ) -> Iterator[Event]:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt is empty")
        if len(prompt) + params.max_new_tokens > self.max_context:
            raise ContextLengthError(
                f"prompt ({len(prompt)} tokens) + max new tokens ({params.max_new_tokens}) exceed the "
                f"{self.max_context}-token context: shorten the chat, lower max new tokens or raise the context length"
            )
        generator = torch.Generator(self.device)
        generator.manual_seed(params.seed if params.seed is not None else int(time.time_ns() % (2**63)))
        stats = GenerationStats(prompt_tokens=len(prompt), speculative=self.drafter is not None)
        stats.acceptance_histogram = [0] * self.block_size
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        t0 = time.perf_counter()
        try:
            yield from self._generate(prompt, params, cancel, generator, stats, t0)
        except torch.OutOfMemoryError:
            self.reset()
            stats.peak_memory_bytes = self._peak_memory()
            yield Finished("error", stats, "out of GPU memory: use a shorter context, a smaller quant or a smaller model")

    def _prefill(self, prompt: list[int], stats: GenerationStats) -> torch.Tensor:
        reused, logits = self._reuse(prompt)
        stats.reused_tokens = reused
        if logits is None:
            # in chunks: attention masks and context features stay small for long prompts
            for begin in range(reused, len(prompt), PREFILL_CHUNK):
                chunk = prompt[begin : begin + PREFILL_CHUNK]
                ids = torch.tensor(chunk, dtype=torch.long, device=self.device)
                final = begin + PREFILL_CHUNK >= len(prompt)
                logits, feats = self.target(ids, self.state, logits="last" if final else None, taps=self.taps)
                self.tokens.extend(chunk)
                self._extend_context(feats)
            self._take_snapshot(logits)
        return logits

    def _extend_context(self, feats: torch.Tensor | None) -> None:
        """Hand the drafter the features of the positions just committed (the last len(feats) tokens)."""
        if feats is not None:
            self.drafter.append_context(feats, len(self.tokens))

    def _draws(self, rows: int, params: SamplingParams, generator) -> Draws | None:
        if params.greedy:
            return None
        return Draws.empty(rows, self.target.cfg.vocab_size, self.device).fill(generator)

    def _generate(self, prompt, params, cancel, generator, stats, t0) -> Iterator[Event]:
        logits = self._prefill(prompt, stats)
        _sync(self.device)
        stats.prefill_s = time.perf_counter() - t0
        yield Prefilled(len(prompt), stats.reused_tokens, stats.prefill_s)

        last = int(first_token(logits, params, self._draws(1, params, generator)).item())
        stats.ttft_s = time.perf_counter() - t0
        stats.new_tokens = 1
        yield Step([last], 0, 0, 0.0, 0.0)
        if last in params.stop_token_ids:
            yield self._finish("stop", stats)
            return
        decode_t0 = time.perf_counter()
        self.tail = None
        if self.fixed is not None:
            self.fixed.begin(last, params, generator)
        stop_ids = torch.tensor([*params.stop_token_ids, -1], dtype=torch.long, device=self.device)
        while True:
            if cancel is not None and cancel.is_set():
                yield self._finish_decode("cancelled", stats, decode_t0)
                return
            remaining = params.max_new_tokens - stats.new_tokens
            if remaining <= 0:
                yield self._finish_decode("length", stats, decode_t0)
                return
            if self.fixed is not None:
                step = self.fixed.step(remaining)
            else:
                step = self._step(last, min(self.block_size - 1, remaining - 1), params, generator, stop_ids, remaining)
            emitted = step.token_ids
            stats.steps += 1
            stats.new_tokens += len(emitted)
            stats.drafted += step.drafted
            stats.accepted += step.accepted
            stats.acceptance_histogram[step.accepted] += 1
            stats.draft_s += step.draft_s
            stats.verify_s += step.verify_s
            yield step
            last = emitted[-1]
            if last in params.stop_token_ids:
                yield self._finish_decode("stop", stats, decode_t0)
                return

    def committed(self, last: int, emitted: list[int]) -> None:
        """Host bookkeeping after a step kept `last` and all but the newest emitted token."""
        self.tokens.append(last)
        self.tokens.extend(emitted[:-1])
        if self.drafter is not None:
            self.drafter.ctx_len = len(self.tokens)

    def _read_tail(self) -> tuple[float, float]:
        """(draft, verify) seconds of the previous step's tail; the stream must have passed it."""
        tail, self.tail = self.tail, None
        if tail is None:
            return 0.0, 0.0
        return self.clock.seconds(tail.rolled_back, tail.appended), self.clock.seconds(tail.verified, tail.rolled_back)

    def _step(self, last: int, draft_len: int, params, generator, stop_ids, remaining: int) -> Step:
        """One eager decode step. Its only host wait is reading the verified tokens; its draft_s and verify_s
        include the previous step's tail (see _Tail), so they add up to the whole decode."""
        start = self.state.length
        clock = self.clock
        left = torch.full((), remaining, dtype=torch.long, device=self.device)
        t0 = clock.mark()
        if self.drafter is None or draft_len == 0:
            ids = torch.full((1,), last, dtype=torch.long, device=self.device)
            logits, feats = self.target(ids, self.state, logits="all", taps=self.taps)
            t1 = clock.mark()
            out = accept(logits, ids[1:], params, self._draws(1, params, generator), left, stop_ids).tolist()
            tail_draft, tail_verify = self._read_tail()
            verify_s = clock.seconds(t0, t1) + tail_verify
            self.tokens.append(last)
            appended = t1
            if feats is not None:  # a drafter's engine on its last token
                self._extend_context(feats)
                appended = clock.mark()
            self.tail = _Tail(t1, t1, appended)
            return Step(out[:1], 0, 0, tail_draft, verify_s)

        # the drafter always drafts a whole block (as it was trained, and as fixed-shape steps do); near the
        # end of an answer only the first draft_len drafts are verified
        ids = self._on_device(self.drafter.propose(last, start, self.block_size - 1)[: draft_len + 1])
        t1 = clock.mark()
        logits, feats = self.target(ids, self.state, logits="all", taps=self.taps, speculative=True)
        T = ids.shape[0]
        out = accept(logits, ids[1:], params, self._draws(T, params, generator), left, stop_ids)
        t2 = clock.mark()
        out = out.tolist()
        keep, accepted = out[T], out[T + 1]
        emitted = out[:keep]
        tail_draft, tail_verify = self._read_tail()
        draft_s = clock.seconds(t0, t1) + tail_draft
        verify_s = clock.seconds(t1, t2) + tail_verify
        self.target.rollback(self.state, keep)  # `last` plus every emitted token but the newest
        self.tokens.append(last)
        self.tokens.extend(emitted[:-1])
        t3 = clock.mark()
        self._extend_context(None if feats is None else feats[:keep])
        self.tail = _Tail(t2, t3, clock.mark())
        return Step(emitted, draft_len, accepted, draft_s, verify_s)

    def _on_device(self, ids: torch.Tensor) -> torch.Tensor:
        """A drafter's block on the target's device; from host memory without a blocking copy."""
        if ids.device == self.device:
            return ids
        if self.device.type == "cuda":
            return ids.pin_memory().to(self.device, non_blocking=True)
        return ids.to(self.device)

    def _peak_memory(self) -> int:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        try:
            import resource
        except ImportError:  # Windows
            return 0
        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

    def _finish_decode(self, reason: str, stats: GenerationStats, decode_t0: float) -> Finished:
        """End after decoding: the last step's tail is waited for, counted, and part of decode_s."""
        if self.fixed is not None:
            draft_s, verify_s = self.fixed.finish()
            stats.draft_s += draft_s
            stats.verify_s += verify_s
        elif self.tail is not None:
            self.clock.wait(self.tail.appended)
            draft_s, verify_s = self._read_tail()
            stats.draft_s += draft_s
            stats.verify_s += verify_s
        stats.decode_s = time.perf_counter() - decode_t0
        return self._finish(reason, stats)

    def _finish(self, reason: str, stats: GenerationStats) -> Finished:
        stats.peak_memory_bytes = self._peak_memory()
        return Finished(reason, stats)
