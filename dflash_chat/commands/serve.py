"""`dflash-chat serve`: the engine behind an OpenAI-compatible API, for editors, Open WebUI, scripts.

The model is chosen, fetched and loaded as the chat app does (--demo, --model, --quant, --target/
--drafter, the `model` setting, or the best pair for this machine); sampling defaults are the
settings'. See dflash_chat/serve/.
"""

from __future__ import annotations

import argparse
import os
import sys

from dflash_chat.models import hardware
from dflash_chat.serve import MAX_BODY
from dflash_chat.settings import flag, ranged

API_KEY_ENV = "DFLASH_CHAT_API_KEY"
DEFAULT_PORT = 8000


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible HTTP API",
        description="Serve the model over an OpenAI-compatible HTTP API: POST /v1/chat/completions and "
        "/v1/completions (streaming or not), GET /v1/models, /health and /metrics (Prometheus, vLLM's "
        "metric names). One answer runs at a time; the rest wait in a queue. Binds 127.0.0.1 unless "
        "--host says otherwise.",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; "
        "0.0.0.0 for every network, then set an API key)",
    )
    p.add_argument("--port", type=ranged(int, 0, 65535), default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on /v1 (or set {API_KEY_ENV})")
    p.add_argument(
        "--no-auth",
        action="store_true",
        help="serve a non-loopback --host without an API key (anyone on that network may use it)",
    )
    p.add_argument("--metrics-auth", action="store_true", help="/metrics needs the API key too (it is open by default)")
    p.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="let web pages from ORIGIN (like http://localhost:3000) call the API; repeatable. "
        "Browser requests from any other origin are refused",
    )
    p.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name clients reach this server by (beside its addresses, localhost and this "
        "machine's name); repeatable. Requests naming another host are refused",
    )
    p.add_argument(
        "--queue",
        type=ranged(int, 0, 10_000),
        default=8,
        help="requests that may wait while one is answered; past it, 429 (default 8)",
    )
    p.add_argument(
        "--max-body",
        type=ranged(int, 1024, 1 << 30),
        default=MAX_BODY,
        metavar="BYTES",
        help=f"largest request body taken (default {MAX_BODY // 2**20} MiB: images come inline, base64); past it, 413",
    )
    p.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch images that requests name by http(s) URL (the server then reaches any address a client names, "
        "its own network's too); without it only inline data: URLs and base64 images are read",
    )
    p.add_argument("--served-model-name", metavar="NAME", help="the model's name in the API (default: its own)")
    add_model_arguments(p)
    p.set_defaults(handler=main)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The flags that choose and load the model and bound its answers, as serve takes them (`launch` too)."""
    p.add_argument(
        "--max-tokens",
        type=flag("max_new_tokens"),
        metavar="N",
        help="the most tokens one answer may have, whatever a request asks (default: the context's room)",
    )
    p.add_argument("--demo", action="store_true", help="serve the tiny built-in demo model pair")
    p.add_argument("--target", metavar="PATH", help="target model: a folder or a GGUF file")
    p.add_argument("--drafter", metavar="PATH", help="DFlash drafter folder or GGUF for --target")
    p.add_argument(
        "--decode",
        type=flag("decode"),
        metavar="auto|graphs|fixed",
        help="decode path (default: the decode setting; eager is an older name for fixed)",
    )
    p.add_argument(
        "--draft",
        type=flag("draft"),
        metavar="auto|off|N",
        help="drafts each step verifies: auto, off or a number (default: the draft setting)",
    )
    p.add_argument(
        "--speculate",
        type=flag("speculate"),
        metavar="auto|dflash|mtp|lookup|none",
        help="which method drafts: auto, dflash, mtp, lookup or none (default: the speculate setting)",
    )
    hardware.add_choice_arguments(p)


def model_request(args: argparse.Namespace, settings):
    """(the settings with the flags' decode, draft, speculate, vision and context, what to load) for the model flags."""
    from dataclasses import replace

    from dflash_chat.runtime.model_source import pick_from_args, resolve

    if args.decode:
        settings = replace(settings, decode=args.decode)
    if args.draft is not None:
        settings = replace(settings, draft=args.draft)
    if args.speculate is not None:
        settings = replace(settings, speculate=args.speculate)
    if getattr(args, "vision", None) is not None:
        settings = replace(settings, vision=args.vision)
    return settings, resolve(
        settings, target=args.target, drafter=args.drafter, demo=args.demo, pick=pick_from_args(args)
    )


def main(args: argparse.Namespace) -> int:
    from dflash_chat import settings as settings_module
    from dflash_chat.runtime.model_source import ModelSource
    from dflash_chat.serve.served import Served
    from dflash_chat.serve.server import bind, serve_forever, served_name, start_loading

    api_key = api_key_from(args, os.environ)
    settings, problems = settings_module.read()
    for problem in problems:
        print(f"note: {problem}", file=sys.stderr)
    settings, request = model_request(args, settings)
    bind(args.host, args.port).close()  # a port in use is said before anything loads
    name = args.served_model_name or (served_name(request) if isinstance(request, ModelSource) else None)
    # name None: the model manager chooses, and the model is named once its files are known
    served = Served(
        name,
        settings,
        api_key=api_key,
        max_waiting=args.queue,
        max_body=args.max_body,
        metrics_auth=args.metrics_auth,
        allow_origins=tuple(args.allow_origin),
        allow_hosts=tuple(args.allow_host),
        max_answer=args.max_tokens,
        allow_image_urls=args.allow_image_urls,
    )
    loader = start_loading(served, request, settings)
    return serve_forever(served, loader, args.host, args.port)


def api_key_from(args: argparse.Namespace, environ) -> str | None:
    """The key to require, or None; a UserError (one line) where serving would fail open: an empty key
    (what `--api-key "$(openssl rand -hex 16)"` gives without openssl), or a network host with no key."""
    from dflash_chat.errors import UserError

    if args.api_key is not None:
        key, where = args.api_key, "--api-key"
    else:
        key, where = environ.get(API_KEY_ENV), API_KEY_ENV
    if key is not None and not key.strip():
        raise UserError(
            f"{where} is empty, so the server would run without a key: give a real key "
            "(like the output of `openssl rand -hex 16`), or leave it out on 127.0.0.1"
        )
    if key is None and not is_loopback(args.host) and not args.no_auth:
        raise UserError(
            f"--host {args.host} lets other machines in, and no API key is set: pass --api-key KEY "
            f"(or set {API_KEY_ENV}), or --no-auth to serve that network without one"
        )
    if key is None and args.metrics_auth:
        raise UserError(f"--metrics-auth needs an API key to check: pass --api-key KEY (or set {API_KEY_ENV})")
    return key.strip() if key is not None else None


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
