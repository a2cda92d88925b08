"""Grammar compiles tried first in a child process (engine/structured.py's `Grammars.compile`).

xgrammar's compile cannot be interrupted (its issue #298), and a pathological schema can take minutes: run in a
thread, one past its bound would be abandoned but go on eating a core. In a child process it is ended with the
process; the next compile starts a new one. The child holds its own compiler for the tokenizer (its vocabulary
sent once, serialized) and answers each compile with the seconds it took, or the error's first line; the parent
then compiles the same grammar itself, which takes about as long, within the bound. The compiled grammar is not
sent back: xgrammar's only form for it is JSON of every state's token masks, 134 MB for Claude Code's tools on
the demo's 6k-token vocabulary (and far more on Qwen's 248k), which took 20 s to write, send and read where the
compile takes one. It is this module run with `python -m` (not multiprocessing: its spawn re-runs the parent's
main module, which a script without a main guard cannot take, and forking a process that runs threads is unsafe);
it imports nothing of the app but engine/constraint.py's wording of an error. Messages are pickled, each after its
length, over the child's stdin and stdout.

Starting a child costs seconds of a core (an interpreter, xgrammar and the torch it imports), so a process keeps
one worker per vocabulary (`shared`, the SHARED_MOST used last): an engine loaded again with the same tokenizer
(another model of one family, the next app a test starts) finds its child up.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

START_SECONDS = 120.0  # a worker that is not up by then is broken (it takes a second or two)
SHARED_MOST = 2  # workers a process keeps for reuse, one per vocabulary
_LENGTH = struct.Struct("<Q")


class CompileTimeout(Exception):
    """The compile passed its bound; its process was ended."""


class CompileFailed(Exception):
    """The grammar engine refused the grammar; the message is its error's first line."""


class CompileWorker:
    def __init__(self, vocabulary: Callable[[], str]) -> None:
        """`vocabulary()`: the tokenizer's xgrammar TokenizerInfo as JSON (made in the background, once)."""
        self._process: subprocess.Popen | None = None
        self._vocabulary = vocabulary
        self._info: str | None = None
        self._lock = threading.Lock()  # one compile at a time, as one thread did before
        self._replies: queue.Queue = queue.Queue()
        self.started = 0  # processes started
        threading.Thread(target=self._warm, daemon=True, name="grammar-worker-start").start()

    def _warm(self) -> None:
        try:
            self.ready()
        except CompileFailed:
            pass  # the first compile tries again and says so

    def ready(self) -> None:
        """Wait until a worker is up (a measurement of compile time leaves the process start out)."""
        with self._lock:
            self._ensure()

    def check(self, kind: str, spec: str, timeout: float) -> float:
        """The seconds the child took to compile the grammar; CompileTimeout past `timeout` seconds (the child is
        ended), CompileFailed when it is refused."""
        with self._lock:
            self._ensure()
            self._send((kind, spec))
            status, value = self._reply(timeout)
        if status != "ok":
            raise CompileFailed(value)
        return value

    def close(self) -> None:
        """End the worker (a later compile starts another)."""
        with self._lock:
            self._stop()

    def __del__(self) -> None:
        self._stop()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def _ensure(self) -> None:
        if self.alive:
            return
        if self._info is None:
            self._info = self._vocabulary()
        root = str(Path(__file__).resolve().parents[2])  # where this package is, wherever the parent found it
        path = os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": path},
            bufsize=0,  # raw pipes: no buffer lock for interpreter shutdown to find held by the reader thread
        )
        self._replies = queue.Queue()
        threading.Thread(
            target=_read_replies, args=(self._process.stdout, self._replies), daemon=True, name="grammar-worker"
        ).start()
        self.started += 1
        self._send(self._info)
        # the start (an interpreter, xgrammar, the vocabulary) is not the compile's: its bound counts from here
        try:
            self._reply(START_SECONDS)
        except CompileTimeout:
            raise CompileFailed("the grammar compiler did not start") from None

    def _send(self, message) -> None:
        assert self._process is not None and self._process.stdin is not None
        try:
            _write(self._process.stdin, message)
        except OSError:  # it died
            self._stop()
            raise CompileFailed("the grammar compiler stopped") from None

    def _reply(self, timeout: float):
        """The worker's next message; CompileTimeout when none comes in `timeout` seconds, CompileFailed when it
        died (either way its process is ended)."""
        try:
            reply = self._replies.get(timeout=timeout)
        except queue.Empty:
            self._stop()
            raise CompileTimeout from None
        if reply is None:
            self._stop()
            raise CompileFailed("the grammar compiler stopped while compiling it")
        return reply

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            if self._process.stdin is not None:
                self._process.stdin.close()  # its stdout is the reader thread's, which closes it at the end
        self._process = None


_shared: OrderedDict[str, CompileWorker] = OrderedDict()  # by the vocabulary's digest, the latest used last
_shared_lock = threading.Lock()


def shared(vocabulary: str) -> CompileWorker:
    """The process's worker for `vocabulary` (an xgrammar TokenizerInfo's JSON), made when there is none; one
    beyond the SHARED_MOST latest is closed (a holder's next compile starts it again)."""
    key = hashlib.sha256(vocabulary.encode()).hexdigest()
    with _shared_lock:
        worker = _shared.get(key)
        if worker is None:
            worker = _shared[key] = CompileWorker(lambda: vocabulary)
        _shared.move_to_end(key)
        evicted = [_shared.popitem(last=False)[1] for _ in range(len(_shared) - SHARED_MOST)]
    for old in evicted:
        old.close()
    return worker


def _read_replies(stream, replies: queue.Queue) -> None:
    """The parent's reader of one worker's messages (None once it ends)."""
    while True:
        try:
            message = _read(stream)
        except (OSError, ValueError, EOFError, pickle.UnpicklingError):
            message = None
        replies.put(message)
        if message is None:
            stream.close()
            return


def _write(stream, message) -> None:
    data = memoryview(_LENGTH.pack(len(payload := pickle.dumps(message))) + payload)
    while data:  # a raw pipe may take part of it
        data = data[stream.write(data) :]
    stream.flush()


def _read(stream):
    """The next message on `stream`; None at its end."""
    head = _exactly(stream, _LENGTH.size)
    if head is None:
        return None
    data = _exactly(stream, _LENGTH.unpack(head)[0])
    return None if data is None else pickle.loads(data)


def _exactly(stream, size: int) -> bytes | None:
    """`size` bytes from `stream` (a raw pipe returns what it has); None at its end."""
    parts, left = [], size
    while left:
        part = stream.read(left)
        if not part:
            return None
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


def serve(stdin, stdout) -> None:
    """The child: a compiler for the vocabulary it is sent first, then one compile per request until stdin ends."""
    import xgrammar as xgr

    from dflash_chat.engine.constraint import first_line  # json and dataclasses only: no torch in the child

    info = xgr.TokenizerInfo.deserialize_json(_read(stdin))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    _write(stdout, "ready")
    while (request := _read(stdin)) is not None:
        kind, spec = request
        try:
            started = time.perf_counter()
            compile_grammar(compiler, kind, spec)
            _write(stdout, ("ok", time.perf_counter() - started))
        except Exception as exc:  # noqa: BLE001 - xgrammar's errors are many kinds; each becomes the user's message
            _write(stdout, ("error", first_line(exc)))


def compile_grammar(compiler, kind: str, spec: str):
    """`spec` compiled by an xgrammar GrammarCompiler as its `kind` says."""
    if kind == "json_schema":
        return compiler.compile_json_schema(spec, any_whitespace=False, strict_mode=False)
    if kind == "structural_tag":
        return compiler.compile_structural_tag(spec)
    if kind == "ebnf":
        return compiler.compile_grammar(spec)
    raise ValueError(f"unknown constraint kind {kind!r}")


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
