"""Answers held to a grammar (structured output): what the decode loop asks of a grammar, over xgrammar.

A `Constraint` (engine/constraint.py, torch-free, made by runtime/constraint.py from a request) says what the
answer must be: a JSON schema, or a structural tag (xgrammar's: free text with tool calls in Qwen's XML form,
a reasoning block before them). `Grammars` compiles one per tokenizer, with a cache (an agent resends the same
tools every turn) and a bound on compile time; its `matcher` is the one object the loop holds per answer:

- `forced_run(k)`: the tokens the grammar forces next (the closing tags, a required key): the loop makes them
  the step's first drafts, free to verify (a plain step verifies them instead), before the forward;
- `fill(bitmask, drafts)`: the allowed tokens at the answer's next position and after each draft in turn,
  into rows of a bitmask (32 tokens a word, as xgrammar writes it), up to the first draft the grammar
  refuses; rows past it allow everything (the verify stops at that draft whatever they say). The loop runs it
  on the host while the device runs the verify's forward; the rule that reads it runs after;
- `settle(kept, accepted)`: after the verify, what was rejected is rolled back, the target's own token taken.

Why this stays exact (engine/sampling.py): the verify masks the target's logits at each row with the
grammar's mask after the tokens before it, so p is the constrained distribution. Drafts are proposals
drawn from their own q, unmasked; the exact rule holds for any q, and a draft the grammar refuses has
p(d) = 0, so it is rejected and its row draws from norm(max(0, p - q)) as for any rejection. A forced draft
has a one-hot q and p(d) = 1. Greedy output is plain constrained decoding's whatever was drafted.

The grammar engine is xgrammar (vLLM's and SGLang's): its masks on Qwen's vocabularies took a few
microseconds at the median here, against tens for llguidance (bench: the constraint's cost per token), and
it ships Qwen3.5/3.6's call format (`qwen_xml`). Only this module imports it.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial

import torch

from dflash_chat.engine.constraint import Constraint, GrammarError, first_line

COMPILE_SECONDS = 30.0  # past this a grammar is refused (a 400 in serve); an agent's tools: 1-3 s, once
CACHE_SIZE = 64  # compiled grammars kept per tokenizer


@dataclass
class Filled:
    """What `Matcher.fill` wrote: its rows (the drafts walked + 1) and the drafts it walked (each allowed)."""

    rows: int
    advanced: int


class Grammars:
    """The grammar engine for one tokenizer: compiles constraints (cached) and makes matchers."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids: tuple[int, ...], *, words: list[str] | None = None):
        """`tokenizer`: a transformers tokenizer; or None with `words`, each token's text (a raw vocabulary)."""
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        self.stop_ids = tuple(stop_ids)
        self.encode = None if tokenizer is None else partial(tokenizer.encode, add_special_tokens=False)
        if tokenizer is None:
            self.info = xgr.TokenizerInfo(
                list(words or ()), xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=list(stop_ids)
            )
        else:
            self.info = xgr.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids)
            )
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        self.words = (vocab_size + 31) // 32
        self._cache: OrderedDict[tuple[str, str], object] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._controls: torch.Tensor | None = None

    def compile(self, constraint: Constraint, timeout: float = COMPILE_SECONDS):
        """The compiled grammar of `constraint` (GrammarError when it cannot be one)."""
        key = (constraint.kind, constraint.spec)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        future = self._pool.submit(self._compile, constraint)
        try:
            compiled = future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            # the compile cannot be interrupted: a new worker takes the next ones while it runs out
            self._pool.shutdown(wait=False)
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
            raise GrammarError(
                f"{constraint.label}: its schema took over {timeout:g} s to compile; simplify it"
            ) from None
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compile(self, constraint: Constraint):
        try:
            if constraint.kind == "json_schema":
                return self.compiler.compile_json_schema(constraint.spec, any_whitespace=False, strict_mode=False)
            if constraint.kind == "structural_tag":
                return self.compiler.compile_structural_tag(constraint.spec)
            if constraint.kind == "ebnf":
                return self.compiler.compile_grammar(constraint.spec)
        except Exception as exc:  # noqa: BLE001 - xgrammar's errors are many kinds; each becomes the user's message
            raise GrammarError(f"{constraint.label}: {first_line(exc)}") from None
        raise GrammarError(f"unknown constraint kind {constraint.kind!r}")

    def controls(self) -> torch.Tensor:
        """The tokens that hold a control character (a byte below 0x20), as a bitmask row: a one-line JSON answer
        holds none (its strings escape them), though xgrammar's JSON strings take them raw."""
        if self._controls is None:
            banned = torch.zeros(self.words * 32, dtype=torch.bool)
            for token, text in enumerate(self.info.decoded_vocab[: self.vocab_size]):
                if any(byte < 0x20 for byte in text) and token not in self.stop_ids:
                    banned[token] = True
            weights = (1 << torch.arange(32, dtype=torch.int64)).reshape(1, 32)
            words = (banned.reshape(-1, 32).long() * weights).sum(1)
            self._controls = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
        return self._controls

    def matcher(self, constraint: Constraint) -> Matcher:
        """A matcher at the start of an answer held to `constraint` (past its prefix)."""
        raw = self._xgr.GrammarMatcher(self.compile(constraint), terminate_without_stop_token=False)
        matcher = Matcher(self, raw, self.controls() if constraint.kind == "json_schema" else None)
        if constraint.prefix and not matcher.raw.accept_string(constraint.prefix):
            raise GrammarError(f"{constraint.label}: the answer's opening {constraint.prefix!r} breaks its grammar")
        matcher.check_satisfiable(constraint.label)
        return matcher


class Matcher:
    """One answer's place in its grammar (see the module docstring)."""

    def __init__(self, grammars: Grammars, raw, banned: torch.Tensor | None = None) -> None:
        """`banned`: a bitmask row of tokens refused everywhere, beside what the grammar refuses."""
        self.grammars = grammars
        self.raw = raw
        self.keep = None if banned is None else ~banned
        self.words = grammars.words
        self.host = torch.empty((1, self.words), dtype=torch.int32)  # grown to the verify's rows
        self.masks = 0  # masks computed (the cost figure's count)
        self.walked = 0  # drafts the last `fill` accepted into the matcher
        self.forcing = True  # its forced tokens are proposed as drafts (bench turns it off to compare)

    def check_satisfiable(self, label: str) -> None:
        row = torch.empty((1, self.words), dtype=torch.int32)
        self.fill_row(row, 0)
        if not _allowed(row[0], self.grammars.vocab_size):
            raise GrammarError(f"{label}: its schema allows no answer at all; check it")

    def first(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [V] of the answer's first token with what the grammar refuses at -inf."""
        self._rows(1)
        self.fill_row(self.host, 0)
        return apply(logits[None], self.host.to(logits.device))[0]

    def fill(self, bitmask: torch.Tensor, drafts: list[int]) -> Filled:
        """Rows 0..len(drafts) of `bitmask` (on any device): the allowed tokens at the next position and after
        each allowed draft; the drafts walked are accepted into the matcher (`settle` rolls back what the verify
        rejects). Past the first refused draft, or a drafted end of the answer, the rows allow everything (the
        verify stops there whatever they say)."""
        T = len(drafts) + 1
        self._rows(T)
        host = self.host
        walked = rows = 0
        for i in range(T):
            self.fill_row(host, i)
            rows = i + 1
            if i == T - 1 or not self.raw.accept_token(drafts[i]):
                break
            walked += 1
            if self.raw.is_terminated():
                break
        host[rows:T].fill_(-1)
        bitmask[:T].copy_(host[:T], non_blocking=True)
        self.walked = walked
        return Filled(rows, walked)

    def forced_run(self, most: int) -> list[int]:
        """The tokens the grammar forces from here, up to `most` (the matcher is left where it was): the text it
        forces (xgrammar's jump-forward string) as the tokenizer writes it, or, on a raw vocabulary, each token
        that is the only one allowed."""
        if not self.forcing:
            return []
        if self.grammars.encode is not None:
            text = self.raw.find_jump_forward_string()
            candidates = self.grammars.encode(text)[:most] if text else []
            run = []
            for token in candidates:
                if token in self.grammars.stop_ids or not self.raw.accept_token(token):
                    break
                run.append(token)
        else:
            row = torch.empty((1, self.words), dtype=torch.int32)
            run = []
            while len(run) < most:
                self.fill_row(row, 0)
                only = _single(row[0], self.grammars.vocab_size)
                if only is None or only in self.grammars.stop_ids or not self.raw.accept_token(only):
                    break
                run.append(only)
        if run:
            self.raw.rollback(len(run))
        return run

    def settle(self, kept: list[int], accepted: int) -> None:
        """After a verify that accepted `accepted` drafts and kept `kept` (the accepted drafts, then the target's
        own token unless a stop or the token limit cut it first): the matcher goes back to the last kept draft
        and takes the target's token."""
        drafts = min(accepted, len(kept), self.walked)
        if self.walked > drafts:
            self.raw.rollback(self.walked - drafts)
        self.walked = 0
        self.advance(kept[drafts:])

    def advance(self, tokens: list[int]) -> None:
        """Take tokens the answer emitted outside a verify (its first)."""
        for token in tokens:
            if not self.raw.accept_token(token):
                raise AssertionError(f"token {token} was masked in, yet the grammar refuses it")

    def fill_row(self, bitmask: torch.Tensor, row: int) -> None:
        """Row `row` of a host bitmask: what the grammar allows next, less the banned tokens."""
        self.raw.fill_next_token_bitmask(bitmask, row)
        self.masks += 1
        if self.keep is not None:
            bitmask[row] &= self.keep

    @property
    def done(self) -> bool:
        return bool(self.raw.is_terminated())

    def _rows(self, T: int) -> None:
        if self.host.shape[0] < T:
            self.host = torch.empty((T, self.words), dtype=torch.int32)


def apply(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits [T, V] with the tokens a bitmask [T, words] leaves out at -inf (a new tensor, on the device)."""
    return logits.masked_fill(~allowed_tokens(bitmask, logits.shape[-1]), float("-inf"))


def allowed_tokens(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """A bitmask [T, words] (bit j of word w: token 32 w + j) as bools [T, vocab], on its device."""
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


def _allowed(row: torch.Tensor, vocab: int) -> int:
    return int(allowed_tokens(row[None], vocab).sum())


def _single(row: torch.Tensor, vocab: int) -> int | None:
    """The one token a mask row allows, or None when it allows several (or none)."""
    nonzero = torch.nonzero(row, as_tuple=True)[0]
    if len(nonzero) != 1:
        return None
    word = int(nonzero[0])
    value = int(row[word]) & 0xFFFFFFFF
    if value & (value - 1):
        return None
    token = word * 32 + value.bit_length() - 1
    return token if token < vocab else None
