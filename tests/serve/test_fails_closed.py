"""serve fails closed: no empty key, no open network host by accident, no other host's name (DNS
rebinding), no cross-origin page, no non-JSON body; a short body times out; dropped answers count as
abort; stopping drains the open streams (an error event, then [DONE]) at once."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from dflash_chat import cli
from dflash_chat.chat.backends.remote import httpx_module
from dflash_chat.commands.serve import api_key_from

from .conftest import Answers, Paced, request, serving, wait_until

KEY = "sk-test-key"
GOOD = {"model": "dflash-chat-demo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
# A streamed question with a long answer, for tests that act mid-answer: no one step reaches its end (an answer
# to "hi" can stop within the first whole-block step, and auto's draft length follows the machine's load).
LONG = {
    **GOOD,
    "messages": [{"role": "user", "content": "Show the function `dedent` from module `textwrap`."}],
    "max_tokens": 300,
    "stream": True,
}


@pytest.fixture(scope="module")
def server(demo_pair):
    with serving(demo_pair, allow_origins=("http://localhost:3000",), body_timeout_s=0.5) as running:
        yield running


def raw(url: str, request: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """What the server sends back to `request` until it closes or `timeout`; and how long that took."""
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(request)
        got = b""
        try:
            while b"\r\n\r\n" not in got or not _whole(got):
                part = sock.recv(65536)
                if not part:
                    break
                got += part
        except TimeoutError:
            pass
    return got, time.monotonic() - started


def _whole(reply: bytes) -> bool:
    head, _, body = reply.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def test_a_body_shorter_than_its_content_length_is_408_within_a_second(server):
    _, url = server
    reply, took = raw(url, request(body=b'{"messages": [', length=500))
    assert status(reply) == 408 and b"did not arrive whole" in reply and took < 3


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "127.0.0.1.nip.io", ""])
def test_another_hosts_name_is_refused(server, host):
    _, url = server
    reply, _ = raw(url, request(host=host))
    assert status(reply) == 421 and b"invalid_host" in reply


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1:9", "[::1]:8000", "app.localhost"])
def test_loopback_names_and_addresses_are_served(server, host):
    _, url = server
    reply, _ = raw(url, request(host=host))
    assert status(reply) == 200, reply[:300]


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"])
def test_a_body_that_is_not_json_is_415(server, kind):
    _, url = server
    reply, _ = raw(url, request(kind=kind))
    assert status(reply) == 415 and b"unsupported_media_type" in reply
    reply, _ = raw(url, request(kind="application/json; charset=utf-8"))
    assert status(reply) == 200


def test_a_cross_origin_page_is_refused_and_an_allowed_one_gets_cors(server):
    _, url = server
    httpx = httpx_module()
    refused = httpx.post(f"{url}/v1/chat/completions", json=GOOD, headers={"Origin": "https://evil.example"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "origin_not_allowed"
    assert httpx.get(f"{url}/v1/models", headers={"Origin": "null"}).status_code == 403
    preflight = httpx.options(
        f"{url}/v1/chat/completions",
        headers={
            "Origin": "http://localhost:3000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization",
        },
    )
    assert preflight.status_code == 204
    assert preflight.headers["access-control-allow-origin"] == "http://localhost:3000"
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    allowed = httpx.post(f"{url}/v1/chat/completions", json=GOOD, headers={"Origin": "http://localhost:3000"})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_metrics_and_health_are_open_unless_metrics_auth(demo_pair):
    httpx = httpx_module()
    with serving(demo_pair, api_key=KEY) as (_, url):
        assert httpx.get(f"{url}/metrics").status_code == 200 and httpx.get(f"{url}/health").status_code == 200
    with serving(demo_pair, api_key=KEY, metrics_auth=True) as (_, url):
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert httpx.get(f"{url}/health").status_code == 200


def test_a_dropped_answer_counts_as_abort(demo_pair, monkeypatch):
    httpx = httpx_module()
    paced = Paced(demo_pair, monkeypatch)
    with serving(demo_pair) as (served, url), httpx.Client(timeout=30) as client:
        paced.go.set()
        assert client.post(f"{url}/v1/chat/completions", json=GOOD).status_code == 200
        paced.go.clear()
        paced.forget()  # its two steps: the stream below must be dropped mid-answer, not before it starts
        with client.stream("POST", f"{url}/v1/chat/completions", json=LONG):
            paced.wait_step()
        assert served.scheduler.wait_idle(30)
        wait_until(lambda: b'finished_reason="abort"' in client.get(f"{url}/metrics").content, 10, "the abort")
        text = client.get(f"{url}/metrics").text
    assert 'request_success_total{engine="0",finished_reason="abort",model_name="dflash-chat-demo"} 1.0' in text
    finished = [line for line in text.splitlines() if line.startswith("vllm:request_success_total")]
    assert len(finished) == 2 and not any('"stop"' in line for line in finished), finished  # the other: length


def test_stopping_ends_open_streams_with_an_error_and_done_at_once(demo_pair, monkeypatch):
    from dflash_chat.serve.served import Served
    from dflash_chat.serve.server import Running

    from .conftest import GREEDY

    httpx = httpx_module()
    paced = Paced(demo_pair, monkeypatch)
    answers = Answers(demo_pair, monkeypatch)
    from dflash_chat.runtime.session import EngineSession

    served = Served("dflash-chat-demo", GREEDY)
    served.ready(EngineSession(demo_pair))
    running = Running(served).start()
    lines: list[str] = []
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", f"{running.url}/v1/chat/completions", json=LONG) as response:
            lines_iter = response.iter_lines()
            lines.append(next(lines_iter))  # the role chunk
            paced.wait_step()
            started = time.monotonic()
            stopper = threading.Thread(target=running.stop)
            stopper.start()
            lines.extend(lines_iter)
            stopper.join(10)
            took = time.monotonic() - started
    events = [line for line in lines if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    assert '"shutting_down"' in events[-2] and "shutting down" in events[-2]
    assert not stopper.is_alive() and took < 3, took
    assert answers[-1].reason == "cancelled"


def cli_args(*argv: str):
    return cli.build_parser().parse_args(["serve", *argv])


@pytest.mark.parametrize(
    "argv, env, words",
    [
        (["--api-key", ""], {}, "--api-key is empty"),
        (["--api-key", "  "], {}, "--api-key is empty"),
        ([], {"DFLASH_CHAT_API_KEY": ""}, "DFLASH_CHAT_API_KEY is empty"),
        (["--host", "0.0.0.0"], {}, "--no-auth"),
        (["--host", "192.168.1.5"], {}, "pass --api-key KEY"),
        (["--metrics-auth"], {}, "--metrics-auth needs an API key"),
    ],
)
def test_serving_that_would_fail_open_is_refused_in_one_line(argv, env, words):
    from dflash_chat.errors import UserError

    with pytest.raises(UserError, match=None) as refused:
        api_key_from(cli_args(*argv), env)
    assert words in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "argv, env, key",
    [
        ([], {}, None),
        (["--host", "::1"], {}, None),
        (["--host", "localhost"], {}, None),
        (["--host", "0.0.0.0", "--no-auth"], {}, None),
        (["--host", "0.0.0.0"], {"DFLASH_CHAT_API_KEY": "k1"}, "k1"),
        (["--api-key", "k2", "--metrics-auth"], {}, "k2"),
    ],
)
def test_serving_with_a_key_or_on_loopback_or_with_no_auth_goes_on(argv, env, key):
    assert api_key_from(cli_args(*argv), env) == key


def test_serve_with_an_empty_key_stops_before_loading(capsys):
    assert cli.main(["serve", "--demo", "--api-key", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--api-key is empty" in err and "Traceback" not in err


SERVE_NO_MODEL = r"""
import sys, threading
from dflash_chat.serve.served import Served
from dflash_chat.serve.server import serve_forever
from dflash_chat.settings import Settings

class Loading:
    done = threading.Event()  # the model never comes: /health says loading

sys.exit(serve_forever(Served("x", Settings()), Loading(), "127.0.0.1", 0))
"""


def test_ctrl_c_stops_serve_in_one_line_without_a_traceback():
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-c", SERVE_NO_MODEL], stderr=subprocess.PIPE, text=True)
    try:
        assert "Ctrl-C stops" in process.stderr.readline()
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=10)
    finally:
        process.kill()
    assert process.returncode == 0 and time.monotonic() - started < 5
    assert err.strip().startswith("stopped after") and err.count("\n") == 1, err


@pytest.mark.parametrize("trickle", [False, True])
def test_headers_that_never_end_are_closed_within_seconds(server, trickle):
    """A client that starts a request and never finishes its headers (all at once, or a byte at a time,
    slowloris-style) is disconnected after the same deadline as a short body."""
    _, url = server
    host, port = url.removeprefix("http://").split(":")
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        closed = False
        while time.monotonic() - started < 4:
            if trickle:
                try:
                    sock.sendall(b"X")
                except OSError:
                    closed = True
                    break
            sock.settimeout(0.2)
            try:
                if sock.recv(1024) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
    assert closed and time.monotonic() - started < 3
