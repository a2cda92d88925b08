"""The generation loop: prefill -> draft -> verify -> accept -> commit, as a stream of events.
One file past 500 lines: the loop, prefix reuse and parking all read and move the one state the engine holds.

Each step verifies [last, d1..dk] in one target forward, keeps the accepted prefix plus the target's own
next token, and commits the target state to the kept length (see state.py). The drafts come from one of
the drafting methods (engine/speculation.py): a DFlash(2) drafter, the target's own MTP layer, or prompt
lookup; `speculate` says which ("auto": chosen per step) and `draft` how many ("auto": chosen per step, a
number, or "off"; see draft_length.py). With no method in use the same loop decodes one token per step:
the baseline every speedup is measured against. The steps themselves (steps/) have fixed shapes and are
captured as CUDA graphs on a GPU; `decode` chooses: "auto" (graphs on CUDA), "graphs", or "fixed" (the same
steps uncaptured; "eager" is an older name for it). This module keeps the loop, prefix reuse, timing and the
statistics.

The engine remembers which tokens its state holds: a prompt that starts with them (the next chat
turn) prefills only the new suffix. A prompt that shares only part of them (a branch: the same system
prompt and tools with another user message, a regenerated answer, an edited tail) resumes from the
nearest checkpoint at or before the point where they differ (engine/prefix_cache.py): each prefill saves
the state that cannot be truncated (GDN state, the drafter's sliding rings, the MTP layer's
newest hidden state) at the end of the system
block (the caller's `marks`), every `checkpoint_every` tokens and at the prompt's end (with the last
logits: the same prompt again needs no forward). Attention-only targets truncate to the shared prefix
(from a little earlier when the drafter's rings must be refilled).

A prompt with images (engine/images.py) is held as keys of its identity: each image's tokens as a key drawn from
its content hash, so no state of one image serves another. Its prefill splices the vision tower's features into
the embeddings and rotates by M-RoPE positions; the decode steps rotate every later token at its index plus the
prompt's offset (`Steps.begin`'s delta).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Iterator, Protocol

import torch

from dflash_chat.engine import speculation
from dflash_chat.engine.draft_length import HELD, Acceptance, Costs, DraftMemory, parse_draft
from dflash_chat.engine.errors import ContextLengthError
from dflash_chat.engine.events import Event, Finished, GenerationStats, Prefilled, Step
from dflash_chat.engine.images import ImagePrefill, PromptImage
from dflash_chat.engine.lookup import PromptLookup
from dflash_chat.engine.memory import PREFILL_CHUNK
from dflash_chat.engine.models.mtp import MTPHead
from dflash_chat.engine.models.target import TargetModel
from dflash_chat.engine.models.vision import VisionTower
from dflash_chat.engine.parked import (
    DEFAULT_PARK_BUDGET,
    Parked,
    Shelf,
    checkpoint_to,
    common_prefix,
    ends_of,
    on_host,
    reusable,
    to_host,
)
from dflash_chat.engine.prefix_cache import CHECKPOINT_EVERY, DEFAULT_BUDGET, Checkpoint, CheckpointCache
from dflash_chat.engine.sampling import Draws, Guide, first_token, noise_columns
from dflash_chat.engine.sampling_params import SamplingParams
from dflash_chat.engine.speculation import PLAIN_STEP, Chooser, Plan, parse_speculate
from dflash_chat.engine.steps import Clock, Steps
from dflash_chat.engine.structured import Matcher, StepGuide

DECODE_MODES = ("auto", "graphs", "fixed", "eager")
COST_ROUNDS = 4  # timed warm-up rounds of every verify size (the first is not counted; the fastest of the rest is)
# rounds after the second are left out once the measuring has taken this long: steps that slow (a large model on a
# CPU) vary little from one timing to the next, and each round costs seconds
COST_ENOUGH_S = 2.0
COST_EVERY = 16  # timings (about 8 steps' verifies and drafts) the step costs take at once within an answer


class Drafter(Protocol):
    block_size: int
    target_layer_ids: list[int]
    ctx_len: int  # committed positions whose context it holds

    def allocate(self, max_context: int) -> None: ...
    def truncate(self, length: int) -> None: ...
    def append_context(self, features: torch.Tensor, start: int, rope: torch.Tensor | None = None) -> None:
        """Take the target features [n, K*H] of the newly committed positions start-n .. start-1 (rotated at
        `rope` [n] where it is given)."""

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
        guide: Guide | None = None,
    ) -> torch.Tensor:
        """The first `drafts` drafts (all B-1 by default) after ids[0] at the device positions `span`, reading
        no host value: greedy, or drawn from a proposal distribution that it writes to q_out [drafts, V] for
        the exact verify. The first k are the same whatever `drafts` >= k is. A `guide` holds them to a grammar
        (engine/sampling.Guide: each read on the host as it is drawn)."""

    def store_context(self, features: torch.Tensor, positions: torch.Tensor, rope: torch.Tensor | None = None) -> None:
        """Context from the target features [n, K*H] at device positions [n] (rotated at `rope` [n])."""

    @property
    def ring_windows(self) -> list[int]:
        """The windows of the layers that keep their context in a ring (engine/models/dflash.py)."""

    def save_rings(self) -> list: ...
    def restore_rings(self, saved: list, length: int) -> None: ...
    def row_caches(self) -> list[torch.Tensor]:
        """Its context caches whose row j holds position j (what a parked conversation copies)."""


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
        mtp: MTPHead | None = None,
        max_context: int = 4096,
        decode: str = "auto",
        draft: str | int = "auto",
        speculate: str = "auto",
        end_ids: tuple[int, ...] = (),
        checkpoint_budget: int = DEFAULT_BUDGET,
        checkpoint_every: int = CHECKPOINT_EVERY,
        park_budget: int = DEFAULT_PARK_BUDGET,
        vision: VisionTower | None = None,
        image_token_id: int | None = None,
    ):
        """`drafter`: a DFlash(2) drafter; `mtp`: the target's MTP layer (load.load_mtp); `speculate`: which of
        these and prompt lookup draft (engine/speculation.py); `end_ids`: the model's own end-of-turn ids, at
        which every answer stops (and at its params').
        `checkpoint_budget`: bytes of prompt checkpoints kept for branches (0: none but the last prompt's);
        `checkpoint_every`: tokens between two of them along a prompt (engine/prefix_cache.py);
        `park_budget`: bytes of host memory for conversations another prompt displaced (engine/parked.py).
        `vision`: the target's vision tower, and `image_token_id` its placeholder token: prompts may have images."""
        if checkpoint_every < 1:
            raise ValueError(f"checkpoint_every must be at least 1 token, not {checkpoint_every}")
        self.checkpoints = CheckpointCache(checkpoint_budget)
        self.shelf = Shelf(park_budget)
        self.checkpoint_every = checkpoint_every
        self.target = target
        self.end_ids = tuple(end_ids)
        self.drafter = drafter
        self.mtp = mtp
        self.vision = vision
        self.image_token_id = image_token_id
        self.max_context = max_context
        self.most = speculation.available(drafter.block_size if drafter else None, mtp is not None)
        self.taps = (list(drafter.target_layer_ids) if drafter else []) + ([target.cfg.num_layers - 1] if mtp else [])
        self.device = target.model.norm.weight.device
        self.lookup = PromptLookup()  # the held tokens (and the newest), indexed for prompt lookup
        self.tokens: list[int] = []  # exactly the tokens the state holds (an image's as its key: engine/images.py)
        self.snapshot: Checkpoint | None = None  # the end of the last prompt, with its logits
        self.clock = Clock(self.device)
        self.decode = decode_mode(decode, self.device)
        self.block_size = 0
        self.speculate = parse_speculate(speculate, self.most)
        self.draft = parse_draft(draft)
        self._configure()

    def set_draft(self, draft: str | int) -> None:
        """The draft setting: "auto", "off" or a number of drafts per step (capped per method).
        The steps are rebuilt (and captured again on CUDA) for the verify sizes it uses; the conversations held
        and parked are kept (the draft changes neither the prompt nor the model: the next turn reuses its prompt)."""
        draft = parse_draft(draft)
        if self.draft != draft:
            self.draft = draft
            self._kept_across(self._configure)

    def set_speculate(self, speculate: str) -> None:
        """The speculate setting: "auto", "dflash", "mtp", "lookup" or "none" (a method the pair lacks is a
        rules.Invalid that says so). The steps are rebuilt as for `set_draft`, and the conversations kept alike while
        the state keeps its width (a wider method's verifies need a wider state: then they are dropped)."""
        speculate = parse_speculate(speculate, self.most)
        if self.speculate != speculate:
            self.speculate = speculate
            self._kept_across(self._configure)

    def _configure(self) -> None:
        """The methods' sizes for the two settings, the state wide enough for them, the steps for those sizes."""
        width = self.block_size
        self.method_sizes = speculation.method_sizes(self.speculate, self.draft, self.most)
        self.takes_plain = speculation.takes_plain_steps(self.draft, self.method_sizes)
        drafting = {T for sizes in self.method_sizes.values() for T in sizes}
        self.sizes = sorted(drafting | ({1} if self.takes_plain else set()))
        self._allocate(max(speculation.width(self.speculate, self.most), self.block_size))
        self.steps = Steps(
            self.target,
            self.drafter,
            self.state,
            taps=self.taps or None,
            sizes=self.sizes,
            graphs=self.decode == "graphs",
            mtp=self.mtp,
            drafts={m: Ts for m, Ts in self.method_sizes.items() if m in speculation.MODELS},
            width=self.block_size,
        )
        self.decode = "graphs" if self.steps.graphs is not None else "fixed"
        self.costs: Costs | None = None  # the step costs, measured before the first answer that weighs plans
        self._drop_held()
        if self.block_size != width:
            self.shelf.clear()  # rows parked for another width's state

    def _allocate(self, width: int) -> None:
        """The state (and the drafting models' caches) for verifies of `width` tokens; kept when as wide."""
        if width == self.block_size:
            return
        self.block_size = width
        # a verify writes up to width - 1 positions past the last committed one
        self.state = self.target.new_state(self.max_context + width, block=width)
        if self.drafter:
            self.drafter.allocate(self.max_context + width)
        if self.mtp is not None:
            self.mtp.allocate(self.max_context + width)

    def _weighs(self) -> bool:
        """Whether a step has more than one plan to weigh (then the step costs are measured)."""
        plans = sum(len(sizes) for sizes in self.method_sizes.values()) + int(self.takes_plain)
        return plans > 1

    def warm_up(self) -> None:
        """Measure what choosing a step's plan needs (a step of each size and method) now, not before the first
        answer; the conversation held is kept."""
        if self.costs is None and self._weighs():
            self._kept_across(self._measure)

    def _measure(self) -> None:
        self.costs = self._measure_costs()

    def _kept_across(self, rebuild: Callable[[], None]) -> None:
        """`rebuild()` (which leaves the state empty), with the held conversation set aside in host memory as
        parking does and brought back after it, exactly as it was. Without room for the copy, or once the state's
        width changed (its rows no longer fit), it is dropped as before."""
        width, aside = self.block_size, self._host_copy()
        rebuild()
        if aside is not None and width == self.block_size:
            self._unpark(aside)

    def _measure_costs(self) -> Costs:
        """Seconds of a step of each verify size, and of each method's draft for it, run on an empty state;
        the held conversation is dropped (the parked ones stay)."""
        steps, clock = self.steps, Clock(self.device)
        started = time.perf_counter()
        for done in range(COST_ROUNDS):  # every size in each round: a busy moment on the machine hits them alike
            if done >= 2 and time.perf_counter() - started > COST_ENOUGH_S:
                break
            for T in self.sizes:
                steps.begin(0, 1, SamplingParams(), None)  # one token held: the MTP layer's first row is there
                for method, sizes in self.method_sizes.items():
                    if T in sizes:
                        clock.timed(method, T, self._draft_step, Plan(method, T, method, (0,) * (T - 1)))
                clock.timed("verify", T, self._verify, T, self.block_size)
                steps.read()
                steps.rewind()
        seconds: dict[tuple[str, int], list[float]] = {}
        for interval, sec in clock.ended(wait=True):
            seconds.setdefault((interval.kind, interval.size), []).append(sec)
        best = {key: min(values[1:] or values) for key, values in seconds.items()}  # the first warms up
        self._drop_held()
        drafts = {m: {T: best[m, T] for T in sizes} for m, sizes in self.method_sizes.items()}
        return Costs({T: best["verify", T] for T in self.sizes}, drafts)

    # -- state bookkeeping --------------------------------------------------------
    def reset(self) -> None:
        """Forget every conversation: the one held and the parked ones."""
        self._drop_held()
        self.shelf.clear()

    def _drop_held(self) -> None:
        self.state.reset()
        if self.drafter:
            self.drafter.truncate(0)
        self.tokens = []
        self.lookup.truncate(0)
        self.snapshot = None
        self.checkpoints.clear()

    def _checkpoint(self, logits: torch.Tensor | None = None, marked: bool = False) -> Checkpoint:
        """What a prefill of the tokens held so far leaves that truncating the caches cannot bring back."""
        rings = self.drafter.save_rings() if self.drafter else []
        mtp_last = self.mtp.last.clone() if self.mtp is not None else None
        return Checkpoint(len(self.tokens), self.state.save_recurrent(), rings, logits, marked, mtp_last)

    def _keep_checkpoint(self, marked: bool) -> None:
        """A checkpoint of the tokens held so far into the cache; none, and the cache emptied, when the device has
        no room for one (the budget is the user's: the model's own memory comes first)."""
        try:
            self.checkpoints.add(self._checkpoint(marked=marked))
        except torch.OutOfMemoryError:
            self.checkpoints.clear()

    def _needs_checkpoints(self) -> bool:
        """Whether truncating alone loses something: GDN state, a drafter's rings, or the MTP layer's hidden state."""
        return bool(self.state.gdn_layers() or (self.drafter and self.drafter.ring_windows) or self.mtp is not None)

    def _restore(self, checkpoint: Checkpoint) -> None:
        length = checkpoint.length
        self.state.load_recurrent(checkpoint.recurrent, length)
        self.tokens = self.tokens[:length]
        if self.drafter:
            self.drafter.truncate(length)
            self.drafter.restore_rings(checkpoint.rings, length)
        if self.mtp is not None and checkpoint.mtp_last is not None:
            self.mtp.last.copy_(checkpoint.mtp_last)
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

    def _held(self) -> list[Checkpoint]:
        """The held conversation's checkpoints and its last prompt's snapshot."""
        return [*self.checkpoints, *([self.snapshot] if self.snapshot is not None else [])]

    def _row_caches(self) -> list[torch.Tensor]:
        """Every cache whose row j holds position j: the target's KV, the drafter's full layers, the MTP layer's."""
        rows = self.state.row_caches() + (self.drafter.row_caches() if self.drafter else [])
        if self.mtp is not None and self.mtp.cache is not None:
            rows += [self.mtp.cache.k, self.mtp.cache.v]
        return rows

    def _switch(self, prompt: list[int]) -> None:
        """Before `prompt` overwrites the held conversation: park it when the prompt breaks into what its last
        prompt held (another conversation, a side request; not the next turn of this one, even one that
        drops the last answer's thinking) and would lose the shelf's `min_tokens` or more; and bring back the parked
        conversation that serves more of the prompt than the held one (engine/parked.py)."""
        if not self.shelf.budget:
            return
        any_length = not self._needs_checkpoints()
        kept = self._held()
        held = reusable(self.tokens, [c.length for c in kept], prompt, any_length, ends_of(kept))
        found = self.shelf.take(prompt, better_than=held, any_length=any_length)
        breaks = self.snapshot is not None and held < self.snapshot.length
        if len(self.tokens) - held >= self.shelf.min_tokens and (breaks or found is not None):
            self._park()
        if found is not None:
            self._unpark(found)

    def _park(self) -> None:
        """The held conversation onto the shelf, in host memory (nothing when it alone is over the budget or the
        host has no room for it)."""
        n = len(self.tokens)
        if sum(t[:n].numel() * t.element_size() for t in self._row_caches()) > self.shelf.budget:
            return
        parked = self._host_copy()
        if parked is not None:
            self.shelf.add(parked)

    def _host_copy(self) -> Parked | None:
        """The held conversation copied to host memory, as `_unpark` brings it back (None when nothing is held or
        the host has no room for it)."""
        n = len(self.tokens)
        if not n:
            return None
        try:
            return Parked(
                list(self.tokens),
                [to_host(t[:n]) for t in self._row_caches()],
                checkpoint_to(self._checkpoint(), on_host),
                [checkpoint_to(c, on_host) for c in self.checkpoints],
                None if self.snapshot is None else checkpoint_to(self.snapshot, on_host),
            )
        except (torch.OutOfMemoryError, MemoryError):
            return None

    def _unpark(self, parked: Parked) -> None:
        """A parked conversation back into the caches: exactly the state it left with, and its checkpoints."""
        n = len(parked.tokens)
        for cache, saved in zip(self._row_caches(), parked.rows, strict=True):
            cache[:n].copy_(saved)
        on_device = partial(torch.Tensor.to, device=self.device)
        self.checkpoints.clear()
        for checkpoint in parked.checkpoints:
            self.checkpoints.add(checkpoint_to(checkpoint, on_device))
        self.snapshot = None if parked.snapshot is None else checkpoint_to(parked.snapshot, on_device)
        self.tokens = list(parked.tokens)
        self._restore(checkpoint_to(parked.end, on_device))

    def _reuse(self, prompt: list[int]) -> tuple[int, torch.Tensor | None]:
        """Bring the state to the longest reusable prefix of `prompt`: (reused tokens, logits if complete)."""
        self._switch(prompt)
        common = common_prefix(self.tokens, prompt)
        if common == len(self.tokens) and common < len(prompt):
            return common, None
        whole = len(prompt)
        # every checkpoint is a prefix of the held tokens: those within the common prefix serve this prompt
        best = self.checkpoints.best(min(common, whole), with_logits_at=whole)
        snap = self.snapshot
        if snap is not None and snap.length <= min(common, whole) and (best is None or snap.length > best.length):
            best = snap
        if not self.state.gdn_layers() and self.mtp is None:  # (the MTP layer needs the hidden state there)
            keep = min(common, whole - 1)  # attention-only: any length truncates
            refill = self._rings_stale(keep)
            if best is None or best.length < keep - refill or (best.length < keep and not refill):
                keep = max(0, keep - refill)
                self._truncate_attention_only(keep)
                return keep, None
        if best is None:
            self._drop_held()
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
        grammar: Matcher | None = None,
        images: Sequence[PromptImage] = (),
    ) -> Iterator[Event]:
        """Answer `prompt_ids`; `images`: the images of its runs of image placeholders, in order (engine/images.py:
        each run as long as its image's tokens). `memory`: what `auto` has learned of the conversation this answer belongs to
        (draft_length.py), which it goes on learning; without one, the answer starts from the fixed priors.
        `marks`: prompt positions where later prompts are likely to branch (the end of the system block):
        the prefill keeps a checkpoint there (engine/prefix_cache.py). `grammar`: the answer is held to it
        (engine/structured.py), exactly as plain constrained decoding would write it."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt is empty")
        pictures = self._images(prompt, images)
        asked = params.max_new_tokens
        if len(prompt) + (asked or 1) > self.max_context:
            raise ContextLengthError(
                f"prompt ({len(prompt)} tokens) + max new tokens ({asked or 1}) exceed the "
                f"{self.max_context}-token context: shorten the chat, lower max new tokens or raise the context length"
            )
        generator = torch.Generator(self.device)
        generator.manual_seed(params.seed if params.seed is not None else int(time.time_ns() % (2**63)))
        drafting = bool(self.method_sizes)
        stats = GenerationStats(
            prompt_tokens=len(prompt),
            speculative=drafting,
            draft=str(self.draft) if drafting else "off",
            speculate=self.speculate if drafting else "none",
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
                prompt, params, cancel, generator, stats, t0, memory or DraftMemory(), limit, marks, grammar, pictures
            )
        except torch.OutOfMemoryError:
            self.reset()
            stats.peak_memory_bytes = self._peak_memory()
            yield Finished(
                "error", stats, "out of GPU memory: use a shorter context, a smaller quant or a smaller model"
            )

    def _images(self, prompt: list[int], images: Sequence[PromptImage]) -> ImagePrefill | None:
        """What the prefill of `prompt` reads of its images (None without any); a prompt whose placeholders do not
        fit its images, or images for a model without a vision tower, is a ValueError that says so."""
        if not images:
            if self.image_token_id is not None and self.image_token_id in prompt:
                raise ValueError("the prompt holds image placeholders but came without its images")
            return None
        if self.vision is None or self.image_token_id is None:
            raise ValueError("this model has no vision tower: it reads no images; send the prompt without them")
        return ImagePrefill(prompt, images, self.vision, self.target.embed_tokens, self.image_token_id)

    def _prefill(
        self, prompt: list[int], stats: GenerationStats, marks: Sequence[int] = (), images: ImagePrefill | None = None
    ) -> torch.Tensor:
        """Bring the state to `prompt` (token ids; a prompt with images is held as `images.keys`); the last logits."""
        ids, prompt = prompt, (images.keys if images is not None else prompt)
        reused, logits = self._reuse(prompt)
        stats.reused_tokens = reused
        stats.image_tokens = images.tokens if images is not None else 0
        if logits is None:
            saves = self._marks(prompt, reused, marks)
            stops = sorted(saves)
            begin = reused
            while begin < len(prompt):
                # in chunks (attention masks and context features stay small), cut at each checkpoint
                end = min([begin + PREFILL_CHUNK, len(prompt), *(p for p in stops if p > begin)])
                part = images.chunk(begin, end) if images is not None else None
                logits = self.steps.prefill(ids[begin:end], final=end == len(prompt), images=part)
                self.tokens.extend(prompt[begin:end])
                if end in saves:
                    self._keep_checkpoint(saves[end])
                begin = end
            assert logits is not None, "the last chunk is final: it has logits"
            stats.vision_s = images.seconds if images is not None else 0.0
            old, self.snapshot = self.snapshot, self._checkpoint(logits)
            if old is not None and old.length < len(self.tokens) and self.checkpoints.budget:
                self.checkpoints.add(old)  # the last prompt's end: where an edit of what followed resumes
        return logits

    def _generate(
        self, prompt, params, cancel, generator, stats, t0, memory, limit, marks, grammar, images
    ) -> Iterator[Event]:
        logits = self._prefill(prompt, stats, marks, images)
        _sync(self.device)
        stats.prefill_s = time.perf_counter() - t0
        yield Prefilled(len(prompt), stats.reused_tokens, stats.prefill_s)

        V = self.target.cfg.vocab_size
        draws = None if params.greedy else Draws.empty(1, V, self.device).fill(generator, 1, noise_columns(params, V))
        stops = self.stop_ids(params)
        if grammar is not None:
            held = time.perf_counter()
            logits = grammar.first(logits)
            stats.constraint_s += time.perf_counter() - held
        last = int(first_token(logits, params, draws).item())
        if grammar is not None:
            grammar.advance([last])
        stats.ttft_s = time.perf_counter() - t0
        stats.new_tokens = 1
        yield Step([last], 0, 0, 0.0, 0.0)
        if last in stops:
            yield self._finish("stop", stats)
            return
        decode_t0 = time.perf_counter()
        estimates: dict[str, Acceptance] = {}  # the answer's, by key: looked up in the memory once

        def estimate(key: str) -> Acceptance:
            found = estimates.get(key)
            if found is None:
                found = estimates[key] = self._estimate(memory, params.greedy, key)
            return found

        chooser = Chooser(
            self.method_sizes,
            self.takes_plain,
            self.costs,
            estimate,
            fixed=self.draft != "auto",
            held=grammar is not None,
        )
        lookup = self._lookup_tokens(last) if chooser.lookup else None
        learned: dict[str, list[int]] = {key: [0] * self.block_size for key in self._estimates()}

        timings: list[tuple[str, int, float]] = []  # step timings the costs have yet to take (`_timed`)

        def finish(reason: str) -> Finished:
            return self._finish_decode(reason, stats, decode_t0, memory, params.greedy, learned, timings)

        steps, clock = self.steps, self.clock
        begun, busy = decode_t0, clock.busy  # a step's host time: its wall time less the model calls in it
        delta = images.delta if images is not None else 0
        steps.begin(
            last, len(self.tokens), params, generator, stops, grammar.words if grammar is not None else 0, delta
        )
        queued = chooser.before_read(False)
        self._queue(queued, grammar)
        plan = self._settle(chooser, queued, lookup, grammar)
        while True:
            if cancel is not None and cancel.is_set():
                yield finish("cancelled")
                return
            remaining = limit - stats.new_tokens
            if remaining <= 0:
                yield finish("length")
                return
            masks = None
            if grammar is not None:
                plan, guide = self._hold_drafts(plan, chooser, grammar, stats)
                masks = partial(self._mask, plan.T, grammar, guide, stats)
            clock.timed("verify", plan.T, self._verify, plan.T, remaining, masks)
            ended = clock.ended()  # before the next draft is queued: it belongs to the next step
            queued = chooser.before_read(plan.method == "lookup")
            self._queue(queued, grammar)  # before the read: the device drafts while the host reads
            read = time.perf_counter()
            out = steps.read()
            read = time.perf_counter() - read
            if grammar is not None:
                held = time.perf_counter()
                grammar.settle(out.tokens, out.accepted)
                stats.constraint_s += time.perf_counter() - held
            self.tokens.append(last)
            self.tokens.extend(out.tokens[:-1])
            if lookup is not None:
                lookup.extend(out.tokens)
            if plan.T > 1:
                estimate(plan.estimate).observe(plan.drafts, out.accepted)
                learned[plan.estimate][min(out.accepted, plan.drafts)] += 1
            draft_s, verify_s = self._count(ended, stats, timings)
            self._timed(timings, COST_EVERY)
            drafted = min(plan.drafts, remaining - 1)
            step = Step(out.tokens, drafted, min(out.accepted, drafted), draft_s, verify_s, plan.method)
            stats.count(step)
            stats.count_host(plan.method, time.perf_counter() - begun - (clock.busy - busy) - read)
            yield step
            begun, busy = time.perf_counter(), clock.busy
            last = out.tokens[-1]
            if last in stops:
                yield finish("stop")
                return
            plan = self._settle(chooser, queued, lookup, grammar)

    def _hold_drafts(
        self, plan: Plan, chooser: Chooser, grammar: Matcher, stats: GenerationStats
    ) -> tuple[Plan, StepGuide]:
        """A constrained step's drafts, drawn held to the grammar (engine/structured.py): a model's each from its
        proposal masked to what the grammar allows there; fixed ones (lookup's, or the tokens the grammar forces,
        where that plan is worth more: speculation.Chooser.forced) end before the first the grammar refuses."""
        held = time.perf_counter()
        forced = grammar.forced_run(self.block_size - 1)
        if forced:
            estimate = speculation.GRAMMAR if grammar.spelled else speculation.GRAMMAR_TEXT
            plan = chooser.forced(plan, forced, self.sizes, estimate)
        guide = grammar.guide(plan.T, self.device)
        stats.constraint_s += time.perf_counter() - held
        if plan.method in speculation.MODELS:
            # timed apart from the method's unheld drafts: read row by row on the host, it costs another figure
            self.clock.timed(plan.method + HELD, plan.T, self.steps.draft, plan.T, plan.method, guide)
        elif plan.T > 1:
            walked = guide.walk(list(plan.tokens))
            fits = [T for T in self.sizes if T <= walked + 1]
            T = max(fits) if fits else plan.T  # a fixed draft setting has no shorter verify: the refused is rejected
            plan = replace(plan, T=T, tokens=plan.tokens[: T - 1]) if T > 1 else PLAIN_STEP
            if T > 1:
                self.clock.timed(plan.method, T, self.steps.place, list(plan.tokens))
        stats.constraint_s += guide.seconds
        stats.forced_drafts += plan.drafts if plan.method == speculation.GRAMMAR else 0
        return plan, guide

    def _mask(self, T: int, grammar: Matcher, guide: StepGuide, stats: GenerationStats) -> None:
        """The verify's masks (the guide's, and the row after its drafts), on the host while the device runs its
        forward."""
        held = time.perf_counter()
        assert self.steps.bitmask is not None, "a constrained answer's steps have a bitmask"
        grammar.finish(self.steps.bitmask, T, guide)
        stats.constraint_s += time.perf_counter() - held

    def _lookup_tokens(self, last: int) -> PromptLookup:
        """Prompt lookup's index brought to the held tokens and the newest one (it kept the last answer's)."""
        common = common_prefix(self.lookup.tokens, self.tokens)
        self.lookup.truncate(common)
        self.lookup.extend(self.tokens[common:] + [last])
        return self.lookup

    def _estimates(self) -> list[str]:
        """The acceptance estimates of the methods in use (and of a grammar's forced tokens)."""
        keys = [m for m in speculation.MODELS if m in self.method_sizes]
        lookup = ["lookup", "lookup-long"] if "lookup" in self.method_sizes else []
        return keys + lookup + [speculation.GRAMMAR, speculation.GRAMMAR_TEXT]

    def _positions(self, estimate: str) -> int:
        if estimate in (speculation.GRAMMAR, speculation.GRAMMAR_TEXT):
            return max(self.sizes) - 1
        return self.most["lookup" if estimate.startswith("lookup") else estimate]

    def _queue(self, plan: Plan | None, grammar: Matcher | None = None) -> None:
        """Queue a model's draft for `plan` (nothing for a plain step, or none; nor in a constrained answer, whose
        drafts are drawn after the read, held to the grammar where it is then: `_hold_drafts`)."""
        if plan is not None and plan.T > 1 and grammar is None:
            self.clock.timed(plan.method, plan.T, self._draft_step, plan)

    def _settle(
        self, chooser: Chooser, queued: Plan | None, lookup: PromptLookup | None, grammar: Matcher | None = None
    ) -> Plan:
        """The step's plan once its tokens before it are read (speculation.Chooser.after_read); its drafts
        placed or queued when they differ from the queued plan's (a constrained answer's: by `_hold_drafts`)."""
        match = lookup.propose(speculation.LOOKUP_MOST) if lookup is not None else None
        plan = chooser.after_read(queued, match)
        if plan is not queued and plan.T > 1 and grammar is None:
            self.clock.timed(plan.method, plan.T, self._draft_step, plan)
        return plan

    def _draft_step(self, plan: Plan) -> None:
        if plan.method == "lookup":
            self.steps.place(list(plan.tokens))
        else:
            self.steps.draft(plan.T, plan.method)

    def _verify(self, T: int, remaining: int, between=None) -> None:
        self.steps.verify(T, remaining, between)
        self.steps.commit(T)

    def _count(self, ended, stats: GenerationStats, timings: list) -> tuple[float, float]:
        """(draft, verify) seconds of intervals that ended, added to the stats, and their timings to `timings`
        for the step costs (`_timed`)."""
        draft = verify = 0.0
        for interval, seconds in ended:
            if interval.kind == "verify":
                verify += seconds
            else:
                draft += seconds
            timings.append((interval.kind, interval.size, seconds))
        stats.draft_s += draft
        stats.verify_s += verify
        return draft, verify

    def _timed(self, timings: list, at_least: int = 1) -> None:
        """The step costs take the timings gathered (once there are `at_least` of them): auto reads the tables
        the costs make every step, and making them again after each step's two timings cost more host time than
        the rest of the step's choosing (COST_EVERY)."""
        if self.costs is not None and len(timings) >= at_least:
            self.costs.observe_all(timings)
            timings.clear()

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
        learned: dict[str, list[int]],
        timings: list[tuple[str, int, float]],
    ) -> Finished:
        """End after decoding: the queued work is waited for and counted (the last, unused draft is not); the
        drafters hold the context of every committed token; the step costs take the answer's last timings; each
        estimate's record learns the answer (how its first drafts landed: `learned[estimate][k]` steps accepted
        exactly k drafts)."""
        self.steps.flush_context()
        self.clock.drop_last_draft()
        self._count(self.clock.ended(wait=True), stats, timings)
        self._timed(timings)
        stats.decode_s = time.perf_counter() - decode_t0
        for key, histogram in learned.items():
            memory.learn(greedy, histogram, key)
        return self._finish(reason, stats)

    def _estimate(self, memory: DraftMemory, greedy: bool, key: str):
        return memory.estimate(greedy, self._positions(key), key)

    def _finish(self, reason: str, stats: GenerationStats) -> Finished:
        stats.peak_memory_bytes = self._peak_memory()
        return Finished(reason, stats)
