"""Running the server: the model through the app's own loader, the HTTP side through uvicorn.

`start_loading` chooses, fetches and loads with runtime/loader.py as the chat screen does, shown on the
terminal (runtime/terminal_load.py: the download bars of `pull`, the loading line of `run`). The socket
is bound here, before uvicorn starts, so a port in use is one line that says what to do. `Running` serves from a thread (the tests and `bench --http`); `serve_forever` from the
main thread (the command, Ctrl-C stops it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
import time

from dflash_chat.errors import UserError
from dflash_chat.runtime.loader import LoadOptions, ModelLoader
from dflash_chat.runtime.model_source import ModelSource, Pick
from dflash_chat.runtime.session import EngineSession
from dflash_chat.runtime.terminal_load import TerminalLoad
from dflash_chat.serve.app import build_app
from dflash_chat.serve.served import Served
from dflash_chat.settings import Settings


def served_name(source: ModelSource) -> str:
    """The model's id in the API: 'dflash-chat-demo', the catalog pair's title and quant, or the files' name."""
    from dflash_chat.engine.load import display_name

    if source.demo:
        return "dflash-chat-demo"
    if source.title:
        return f"{source.title}-{source.target_quant}" if source.target_quant else source.title
    return display_name(source.target)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or a UserError that says what to change."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError as exc:
        why = "is in use" if exc.errno in (98, 48, 10048) else f"cannot be used ({exc.strerror or exc})"
        raise UserError(f"{host}:{port} {why}: pass another --port (or --host)") from None
    sock.setblocking(False)
    return sock


def start_loading(
    served: Served, request: ModelSource | Pick, settings: Settings, *, quiet: bool = False
) -> TerminalLoad:
    """Begin choosing, fetching and loading `request` in worker threads; `served` answers once it loaded."""

    def loaded(loader: ModelLoader, seconds: float) -> None:
        assert loader.source is not None and loader.pair is not None
        if served.name is None:
            served.name = served_name(loader.source)
        served.ready(EngineSession(loader.pair))
        load.say(f"{loader.name()} is ready ({seconds:.1f} s to load)")

    def failed(error: str) -> None:
        served.load_error = error

    load = TerminalLoad(LoadOptions.of(settings), quiet=quiet, loaded=loaded, failed=failed)
    return load.begin(request)


def _uvicorn(served: Served, log_level: str, host: str):
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's, but a shutdown first ends every open answer (an error event and [DONE] for a stream),
        so connections close at once instead of after the graceful timeout with a CancelledError; and the
        signal is not raised again afterwards (Ctrl-C ends in one line, not a KeyboardInterrupt)."""

        cut = 0
        interrupted = False  # a signal came while serving (uvicorn's own flag is set per run)

        async def shutdown(self, sockets=None) -> None:
            self.cut = served.drain()
            await super().shutdown(sockets)

        @contextlib.contextmanager
        def capture_signals(self):
            with super().capture_signals():
                yield
                self.interrupted = self.interrupted or bool(self._captured_signals)
                self._captured_signals.clear()

    config = uvicorn.Config(
        build_app(served, host),
        log_level=log_level,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=5,
        http=_headers_deadline(served.body_timeout_s),
    )
    server = Server(config)
    return server


def _headers_deadline(seconds: float):
    """uvicorn's h11 protocol with a deadline for each request's line and headers: a client that starts a
    request and never finishes its headers (slowloris, one byte now and then) is closed after `seconds`,
    as a short body is answered 408 (h11 alone waits forever for them)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadersDeadline(H11Protocol):
        deadline = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # the next request on this connection has as long for its headers

        def connection_lost(self, exc) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
            self.deadline = self.loop.call_later(seconds, self._expired)

        def _expired(self) -> None:
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():  # headers still not whole
                self.transport.close()

    return HeadersDeadline


class Running:
    """The server on a thread; `url` is its base (http://127.0.0.1:PORT). Stop it with `stop()`."""

    def __init__(self, served: Served, host: str = "127.0.0.1", port: int = 0) -> None:
        self.served = served
        self.sock = bind(host, port)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = _uvicorn(served, "warning", host)
        self.thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve(sockets=[self.sock])), name="dflash-serve", daemon=True
        )

    def start(self, timeout: float = 30.0) -> Running:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.served.close()  # the running answer is cancelled: the engine stops at its next step
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()

    def __enter__(self) -> Running:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_forever(served: Served, loader: TerminalLoad, host: str, port: int) -> int:
    """Serve until Ctrl-C (or the model fails to load: then its error, exit status 2)."""
    sock = bind(host, port)
    server = _uvicorn(served, "warning", host)
    _log_in_one_line()

    def watch() -> None:
        loader.done.wait()
        if served.load_error:
            server.should_exit = True

    threading.Thread(target=watch, daemon=True).start()

    def stop_early(signum, frame) -> None:  # Ctrl-C before uvicorn's own handlers are in place
        server.interrupted = server.should_exit = True

    previous = signal.signal(signal.SIGINT, stop_early)
    shown = "localhost" if host in ("127.0.0.1", "::1") else host
    print(
        f"serving {served.name} on http://{shown}:{sock.getsockname()[1]}/v1 "
        f"(OpenAI API; /health, /metrics){' with an API key' if served.api_key else ''}; Ctrl-C stops",
        file=sys.stderr,
        flush=True,
    )
    started = time.monotonic()
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGINT, previous)
        served.close()
        sock.close()
    if served.load_error:
        raise UserError(served.load_error)
    if server.interrupted:
        cut = f"; {server.cut} answer{'s' if server.cut != 1 else ''} cut short" if server.cut else ""
        print(f"stopped after {time.monotonic() - started:.0f} s{cut}", file=sys.stderr, flush=True)
    return 0


def _log_in_one_line() -> None:
    """The server's own notes (a refused request, a failed answer) as single lines on stderr."""
    logger = logging.getLogger("dflash_chat.serve")
    if not any(isinstance(h, _Stderr) for h in logger.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("serve: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


class _Stderr(logging.StreamHandler):
    """Whatever sys.stderr is at the time (the tests swap it)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass
