"""Answers held to a grammar (structured output): what the decode loop asks of a grammar, over xgrammar.

A `Constraint` (engine/constraint.py, torch-free, made by runtime/constraint.py from a request) says what the
answer must be: a JSON schema, or a structural tag (xgrammar's: free text with tool calls in Qwen's XML form,
a reasoning block before them). `Grammars` compiles one per tokenizer, with a cache (an agent resends the same
tools every turn) and a bound on compile time; its `matcher` is the one object the loop holds per answer:

- `forced_run(k)`: the tokens the grammar forces next (the closing tags, a required key), as the tokenizer
  writes their text: a step no model drafts may verify them as free drafts (speculation.Chooser.forced);
- `guide(T)`: the step's drafts held to the grammar as they are drawn (`StepGuide`, after the read of the step
  before): each row's mask, the grammar after the drafts before it, is computed on the host into the rows the
  verify reads; a model's draft is drawn from its q masked by it (engine/sampling.guided_draft: where the
  grammar allows one token, that token, in the tokens the model would write), fixed drafts (lookup's, the
  forced ones) are walked up to the first the grammar refuses;
- `finish(bitmask, T, guide)`: the verify's rows, the guide's and the one after its last draft, copied to the
  device's bitmask; rows past a refused draft or a drafted end allow everything (the verify stops there
  whatever they say). The loop runs it on the host while the device runs the verify's forward;
- `settle(kept, accepted)`: after the verify, what was rejected is rolled back, the target's own token taken.

Why this stays exact (engine/sampling.py): the verify masks the target's logits at each row with the
grammar's mask after the tokens before it, so p is the constrained distribution; a model's draft at that row
was drawn from q masked by the same mask and renormalised, and that q is what the rule reads. The exact rule
holds for any q the draft was drawn from; masking it only spares drafts certain to be rejected. A fixed draft
(lookup's, a forced one) has a one-hot q. Greedy output is plain constrained decoding's whatever was drafted.

The grammar engine is xgrammar (vLLM's and SGLang's): its masks on Qwen's vocabularies took a few
microseconds at the median here, against tens for llguidance (bench: the constraint's cost per token), and
it ships Qwen3.5/3.6's call format (`qwen_xml`). Only this module and its compile worker
(engine/compile_worker.py: each compile runs first in a child process, ended past its bound, then here) import it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from functools import partial

import torch

from dflash_chat.engine import compile_worker
from dflash_chat.engine.compile_worker import CompileFailed, CompileTimeout
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

    def __init__(
        self, tokenizer, vocab_size: int, stop_ids: tuple[int, ...], *, words: list[str] | list[bytes] | None = None
    ):
        """`tokenizer`: a transformers tokenizer; or None with `words`, each token's text or bytes (a raw
        vocabulary, as a tiktoken file holds it)."""
        import xgrammar as xgr

        self._xgr = xgr
        self.vocab_size = vocab_size
        self.stop_ids = tuple(stop_ids)
        self.encode = None if tokenizer is None else partial(tokenizer.encode, add_special_tokens=False)
        if tokenizer is None:
            self.info = xgr.TokenizerInfo(
                words or [], xgr.VocabType.RAW, vocab_size=vocab_size, stop_token_ids=list(stop_ids)
            )
        else:
            self.info = xgr.TokenizerInfo.from_huggingface(
                tokenizer, vocab_size=vocab_size, stop_token_ids=list(stop_ids)
            )
        self.worker = compile_worker.shared(self.info.serialize_json())
        self.words = (vocab_size + 31) // 32
        self._cache: OrderedDict[tuple[str, str], object] = OrderedDict()
        self._lock = threading.Lock()
        self._controls: torch.Tensor | None = None
        self._texts: list[bytes] | None = None
        self._xgr_compiler = None
        self._compiling = threading.Lock()

    def compile(self, constraint: Constraint, timeout: float = COMPILE_SECONDS):
        """The compiled grammar of `constraint` (GrammarError when it cannot be one)."""
        key = (constraint.kind, constraint.spec)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        try:
            # first in a child process: one past the bound is ended, not left running; then here, as fast
            # (engine/compile_worker.py)
            self.worker.check(constraint.kind, constraint.spec, timeout)
            with self._compiling:  # one compile at a time here, as in the child (it releases the GIL)
                try:
                    compiled = compile_worker.compile_grammar(self._compiler(), constraint.kind, constraint.spec)
                except Exception as exc:  # noqa: BLE001 - as the child words xgrammar's many kinds of error
                    raise CompileFailed(first_line(exc)) from None
        except CompileTimeout:
            raise GrammarError(
                f"{constraint.label}: its schema took over {timeout:g} s to compile; simplify it"
            ) from None
        except CompileFailed as exc:
            raise GrammarError(f"{constraint.label}: {exc}") from None
        with self._lock:
            self._cache[key] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return compiled

    def _compiler(self):
        """This process's compiler for the vocabulary (made at the first compile)."""
        if self._xgr_compiler is None:
            self._xgr_compiler = self._xgr.GrammarCompiler(self.info, max_threads=1, cache_enabled=False)
        return self._xgr_compiler

    def texts(self) -> list[bytes]:
        """Each token's text, as bytes (read once: xgrammar copies the whole vocabulary at each read)."""
        if self._texts is None:
            self._texts = list(self.info.decoded_vocab)
        return self._texts

    def controls(self) -> torch.Tensor:
        """The tokens that hold a control character (a byte below 0x20), as a bitmask row: a one-line JSON answer
        holds none (its strings escape them), though xgrammar's JSON strings take them raw."""
        if self._controls is None:
            banned = torch.zeros(self.words * 32, dtype=torch.bool)
            for token, text in enumerate(self.texts()[: self.vocab_size]):
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
        self.walked = 0  # drafts the last step accepted into the matcher
        self.forcing = True  # its forced tokens are proposed as drafts (bench turns it off to compare)
        self.opening = False  # host row 0 holds the answer's first mask (computed once: the check, then `first`)
        self.spelled = True  # the last forced run is in the tokens the answer wrote its text in (or a raw vocabulary's)
        self.spelling = Spelling(grammars.texts() if grammars.encode is not None else [])

    def check_satisfiable(self, label: str) -> None:
        self.fill_row(self.host, 0)
        if not _allowed(self.host[0], self.grammars.vocab_size):
            raise GrammarError(f"{label}: its schema allows no answer at all; check it")
        self.opening = True

    def first(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits [V] of the answer's first token with what the grammar refuses at -inf."""
        if not self.opening:
            self.fill_row(self.host, 0)
        self.opening = False
        return apply(logits[None], self.host[:1].to(logits.device))[0]

    def guide(self, T: int, device: torch.device) -> StepGuide:
        """The guide of a step that verifies T tokens."""
        self._rows(T)
        self.opening = False
        return StepGuide(self, device)

    def finish(self, bitmask: torch.Tensor, T: int, guide: StepGuide) -> Filled:
        """Rows 0..T-1 of `bitmask` (on any device) for a verify of T after `guide` walked its drafts: the allowed
        tokens at the next position and after each draft walked, the last row computed here (the loop runs it
        while the device runs the verify's forward). The drafts walked stay accepted into the matcher (`settle`
        rolls back what the verify rejects). Past the first refused draft, or a drafted end of the answer, the
        rows allow everything (the verify stops there whatever they say)."""
        rows = min(guide.rows, T)
        if rows < T and guide.open:
            self.fill_row(self.host, rows)
            rows += 1
        self.host[rows:T].fill_(-1)
        bitmask[:T].copy_(self.host[:T], non_blocking=True)
        self.walked = guide.walked
        return Filled(rows, guide.walked)

    def forced_run(self, most: int) -> list[int]:
        """The tokens the grammar forces from here, up to `most` (the matcher is left where it was). On a
        tokenizer's vocabulary, the text it forces (xgrammar's jump-forward string) in the tokens the target
        wrote that text in earlier in the answer (`spelled`); text it has not written yet, as the tokenizer
        writes it (the target often writes it otherwise: the run then ends where its spelling is known). On a
        raw vocabulary, each token that is the only one allowed."""
        if not self.forcing:
            return []
        if self.grammars.encode is not None:
            text = self.raw.find_jump_forward_string()
            spelled = self.spelling.spell(text.encode(), most) if text else []
            self.spelled = bool(spelled)
            candidates = spelled or (self.grammars.encode(text)[:most] if text else [])
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
        self.spelling.extend(kept[:drafts])
        self.advance(kept[drafts:])

    def advance(self, tokens: list[int]) -> None:
        """Take tokens the answer emitted outside a verify (its first)."""
        self.opening = self.opening and not tokens
        self.spelling.extend(tokens)
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


class Spelling:
    """The answer's tokens so far, indexed by their text: how the target writes a text it wrote before. A weak
    target (the demo's) writes the grammar's forced text in its own tokens, not the tokenizer's (`"`, `:` for
    `":`), the same way each time it comes back (a key's `": "`, a value's `", "`, a call's closing tags)."""

    STARTS = 4  # the latest places a token was written that a spelling may start from

    def __init__(self, vocab: list[bytes]) -> None:
        self.vocab = vocab
        self.tokens: list[int] = []
        self.at: dict[bytes, list[int]] = {}  # a token's text: where it was written
        self.longest = 0  # the longest text of a token written (no start of a text past it is looked up)

    def extend(self, tokens: list[int]) -> None:
        if not self.vocab:
            return
        for token in tokens:
            text = self.vocab[token] if token < len(self.vocab) else b""
            if text:
                self.at.setdefault(text, []).append(len(self.tokens))
                self.longest = max(self.longest, len(text))
            self.tokens.append(token)

    def spell(self, text: bytes, most: int) -> list[int]:
        """The longest start of `text` the answer wrote before, in the tokens it wrote it in (up to `most`): its
        longest piece written in one run, then the longest from where that ends, and so on."""
        run: list[int] = []
        done = 0
        while len(run) < most:
            piece, length = self._longest(text[done:], most - len(run))
            if not piece:
                break
            run += piece
            done += length
        return run

    def _longest(self, text: bytes, most: int) -> tuple[list[int], int]:
        best: list[int] = []
        covered = 0
        for end in range(1, min(len(text), self.longest) + 1):
            for start in self.at.get(text[:end], [])[-self.STARTS :]:
                run, done = self._follow(start, text, most)
                if done > covered:
                    best, covered = run, done
        return best, covered

    def _follow(self, start: int, text: bytes, most: int) -> tuple[list[int], int]:
        run, done = [], 0
        for token in self.tokens[start : start + most]:
            piece = self.vocab[token] if token < len(self.vocab) else b""
            if not piece or not text.startswith(piece, done):
                break
            run.append(token)
            done += len(piece)
        return run, done


class StepGuide:
    """One step's drafts walked through the grammar as they are drawn (engine/sampling.Guide), row after row:
    row t's mask (the grammar after the drafts before it) goes into the matcher's host rows, which the verify
    reads too, so each mask is computed once; the draft drawn there is accepted into the matcher. A draft the
    grammar refuses (a fixed proposal's) or the end of the answer ends the walk: past it the guide holds nothing."""

    def __init__(self, matcher: Matcher, device: torch.device) -> None:
        self.matcher, self.device = matcher, device
        self.rows = 0  # mask rows computed
        self.walked = 0  # drafts accepted into the matcher
        self.open = True
        self.seconds = 0.0  # host time spent in the grammar

    def allowed(self, row: int) -> torch.Tensor | None:
        if not self._fill(row):
            return None
        host = self.matcher.host[row : row + 1]
        return allowed_tokens(host.to(self.device), self.matcher.grammars.vocab_size)[0] if host.any() else None

    def _fill(self, row: int) -> bool:
        """Row `row`'s mask (False: the walk has ended)."""
        if not self.open:
            return False
        start = time.perf_counter()
        self.matcher.fill_row(self.matcher.host, row)
        self.rows = row + 1
        self.seconds += time.perf_counter() - start
        return True

    def take(self, row: int, token) -> None:
        if not self.open:
            return
        value = int(token)
        start = time.perf_counter()
        word = int(self.matcher.host[row, value >> 5]) if value < self.matcher.grammars.vocab_size else 0
        if (word >> (value & 31)) & 1 and self.matcher.raw.accept_token(value):
            self.walked += 1
            self.open = not self.matcher.raw.is_terminated()
        else:
            self.open = False
        self.seconds += time.perf_counter() - start

    def walk(self, tokens: list[int]) -> int:
        """Fixed drafts (lookup's, the grammar's forced ones) walked up to the first the grammar refuses: how many
        it took."""
        for row, token in enumerate(tokens):
            if not self._fill(row):
                break
            self.take(row, token)
        return self.walked


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
