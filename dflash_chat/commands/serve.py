"""`dflash-chat serve`: the engine behind an OpenAI-compatible API, for editors, Open WebUI, scripts.

The model is chosen, fetched and loaded as the chat app does (--demo, --model, --quant, --target/
--drafter, the `model` setting, or the best pair for this machine); sampling defaults are the
settings'. See dflash_chat/serve/.
"""

from __future__ import annotations

import argparse
import os

from dflash_chat import hardware
from dflash_chat.settings import flag, ranged

API_KEY_ENV = "DFLASH_CHAT_API_KEY"
DEFAULT_PORT = 8000


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the model over an OpenAI-compatible HTTP API",
        description="Serve the model over an OpenAI-compatible HTTP API: POST /v1/chat/completions and "
        "/v1/completions (streaming or not), GET /v1/models, /health and /metrics (Prometheus, vLLM's "
        "metric names). One answer runs at a time; the rest wait in a queue. Binds 127.0.0.1 unless "
        "--host says otherwise.",
    )
    p.add_argument("--demo", action="store_true", help="serve the tiny built-in demo model pair")
    p.add_argument("--target", metavar="PATH", help="target model: a folder or a GGUF file")
    p.add_argument("--drafter", metavar="PATH", help="DFlash drafter folder or GGUF for --target")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only; "
                   "0.0.0.0 for every network, then set an API key)")
    p.add_argument("--port", type=ranged(int, 0, 65535), default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on /v1 (or set {API_KEY_ENV})")
    p.add_argument("--queue", type=ranged(int, 0, 10_000), default=8,
                   help="requests that may wait while one is answered; past it, 429 (default 8)")
    p.add_argument("--max-body", type=ranged(int, 1024, 1 << 30), default=4 * 1024 * 1024, metavar="BYTES",
                   help="largest request body taken (default 4 MiB); past it, 413")
    p.add_argument("--served-model-name", metavar="NAME", help="the model's name in the API (default: its own)")
    p.add_argument("--decode", type=flag("decode"), metavar="auto|graphs|fixed",
                   help="decode path (default: the decode setting; eager is an older name for fixed)")
    p.add_argument("--draft", type=flag("draft"), metavar="auto|off|N",
                   help="drafts each step verifies: auto, off or a number (default: the draft setting)")
    hardware.add_choice_arguments(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from dflash_chat import settings as settings_module
    from dflash_chat.chat.model_source import DEVICE_ENV, ModelSource, pick_from_args, resolve
    from dflash_chat.commands.run import check_device_name
    from dflash_chat.serve.app import Served
    from dflash_chat.serve.server import bind, serve_forever, served_name, start_loading

    check_device_name(os.environ.get(DEVICE_ENV), DEVICE_ENV)
    settings, problems = settings_module.read()
    for problem in problems:
        print(f"note: {problem}")
    if args.decode:
        settings = replace(settings, decode=args.decode)
    if args.draft is not None:
        settings = replace(settings, draft=args.draft)
    request = resolve(settings, target=args.target, drafter=args.drafter, demo=args.demo, pick=pick_from_args(args))
    bind(args.host, args.port).close()  # a port in use is said before anything loads
    name = args.served_model_name or (served_name(request) if isinstance(request, ModelSource) else None)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    # name None: the model manager chooses, and the model is named once its files are known
    served = Served(name, settings, api_key=api_key, max_waiting=args.queue, max_body=args.max_body)
    loader = start_loading(served, request, settings)
    return serve_forever(served, loader, args.host, args.port)
